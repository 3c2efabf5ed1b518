"""Trace a model from the zoo into the graph IR and print its channel groups and FLOPs.

``hpcnb.ir.trace`` turns a PyTorch module into a graph of typed nodes with shapes and
costs; its channel-dependency groups are the dimensions that must shrink together when
the network is pruned, found by graph traversal. Run it with
``python examples/ir_trace.py --model resnet`` (any key of ``hpcnb.models.ZOO``).
"""

from __future__ import annotations

import argparse

from hpcnb import models
from hpcnb.ir import trace


def main() -> None:
    """Trace the chosen model and print its summary, FLOPs by kind and channel groups."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet", choices=sorted(models.ZOO))
    parser.add_argument("--size", default="tiny", choices=("tiny", "default"))
    args = parser.parse_args()
    spec = models.ZOO[args.model]
    model, x = spec.build(args.size), spec.example_input(args.size)
    graph = trace(model, x)
    print(f"model: {args.model} ({spec.family}, size {args.size}), input {tuple(x.shape)}")
    print(graph.summary())
    print(f"total FLOPs: {graph.total_flops():,}")
    for kind, flops in sorted(graph.flops_by_kind().items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<16} {flops:>14,}")
    groups = graph.groups()
    prunable = [g for g in groups if g.prunable]
    print(f"channel groups: {len(groups)} ({len(prunable)} prunable)")
    for group in groups:
        state = "prunable" if group.prunable else f"fixed: {group.reason}"
        print(f"  {group.id:<5} {group.kind:<8} size {group.size:>4}  {state}")


if __name__ == "__main__":
    main()
