"""Finding the channel-dependency groups of a graph: the traversal that applies the channel rules.

Every axis of every tensor in the graph is described by a list of *segments*
``(space, start, end)``: pieces of *spaces*. A space is either a parameter (or
buffer) axis - ``("layer1.0.conv1.weight", 0)`` - a virtual space declared by
a leaf operator (attention heads), or an anonymous axis (batch, spatial, the
network input) that no parameter owns.

A reshape that splits one channel axis into several (``C -> (heads, head_dim)``,
``3*C -> (3, heads, head_dim)``) or merges several into one (``(C, H, W) -> C*H*W``
before a linear layer) maps each outer axis to a *derived* space whose element
``i`` stands for whole units of the base axis; the base axis itself can then
only be pruned in those units. This is how attention heads written with plain
tensor ops, and conv channels flattened into a classifier, are found without
any per-model rule.

The traversal walks the fx graph once in topological order and applies one
rule per op (:mod:`hpcnb.ir.rules`): a convolution's output channel axis *is*
its weight's axis 0; a residual add *unifies* its inputs' channel axes; a
concat *concatenates* segment lists (so offsets are carried); a chunk/split
*slices* them; a depthwise convolution and a norm follow their input, and so
on. Unifying two segment lists whose boundaries differ cuts the spaces so that
they align; the walk repeats until no new cut appears. The union-find classes
of the resulting atomic intervals are the channel groups. Ops whose channel
mapping is unknown (a reshape that mixes a channel axis with another axis, an
unsupported op) *fix* their axes: groups touching a fixed atom, the model
input or the model output are reported with ``prunable=False``.
"""

from __future__ import annotations

from hpcnb.ir.channels import ChannelAnalysis
from hpcnb.ir.graph import Graph, IRTraceError
from hpcnb.ir.rules import apply_rule

__all__ = ["ChannelAnalysis", "analyse_channels"]


def analyse_channels(graph: Graph, max_passes: int = 50) -> ChannelAnalysis:
    """Run the channel traversal over ``graph`` and return the finished analysis.

    Args:
        graph: A traced graph.
        max_passes: Passes allowed before giving up (each new cut needs one more).

    Returns:
        The analysis; its ``groups`` are the channel groups.

    Raises:
        IRTraceError: If a rule fails (naming the node) or the walk does not converge.
    """
    analysis = ChannelAnalysis(graph)
    for _ in range(max_passes):
        analysis.start_pass()
        for n in graph.gm.graph.nodes:
            try:
                analysis.axes[n.name] = apply_rule(analysis, n)
            except IRTraceError:
                raise
            except Exception as err:
                raise IRTraceError(
                    f"channel analysis failed at node '{n.name}' "
                    f"(module '{n.meta.get('scope', '')}'): {type(err).__name__}: {err}"
                ) from err
        if not analysis.changed:
            break
    else:
        raise IRTraceError(f"channel analysis did not converge in {max_passes} passes")
    analysis.build_groups()
    return analysis
