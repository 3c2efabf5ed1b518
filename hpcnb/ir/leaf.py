"""The IR leaf-module protocol: a module that tells ``hpcnb.ir`` its own kind, cost and channels.

``hpcnb.ir`` does not trace into a module that implements :class:`IRLeaf`; it
asks the module instead, through four members:

* ``ir_kind`` - the op kind of the node, a kind registered in :mod:`hpcnb.ir.kinds`
  (e.g. "attention", "scan"; a new one is one :func:`hpcnb.ir.kinds.register_kind`);
* ``ir_flops(in_shapes, out_shape)`` - the FLOPs of one call (multiply-add = 2);
* ``ir_channels(ctx, in_axes)`` - how the module's parameter axes tie to the
  channel axes of its inputs and output: ``ctx`` is the channel analysis
  (:class:`hpcnb.ir.channels.ChannelAnalysis`) with parameter names relative to
  the module (``ctx.param("qkv.weight", 1)``), ``in_axes`` holds, per input, the
  per-axis segment lists; it returns the output's per-axis segments;
* ``ir_refresh()`` - recompute size attributes after :func:`hpcnb.ir.extract`
  has sliced the module's parameters.

:class:`hpcnb.models.MultiHeadSelfAttention` and :class:`hpcnb.models.SelectiveScan`
are examples. A leaf is the right tool for a module whose forward cannot be
traced symbolically (a Python loop over time steps) or whose channel structure
is better declared than discovered; an op that is a plain function, or a module
type you do not own, is added with :func:`hpcnb.ir.ops.register_op` instead.

>>> from torch import nn
>>> class Scale(nn.Module):
...     ir_kind = "mul"
...     def forward(self, x):
...         return 2 * x
...     def ir_flops(self, in_shapes, out_shape):
...         return 0
...     def ir_channels(self, ctx, in_axes):
...         return in_axes[0]
...     def ir_refresh(self):
...         pass
>>> is_ir_leaf(Scale()), is_ir_leaf(nn.Linear(2, 2))
(True, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from hpcnb.ir.channels import ChannelAnalysis

__all__ = ["IRLeaf", "is_ir_leaf"]


@runtime_checkable
class IRLeaf(Protocol):
    """A module that declares its op kind, FLOPs and channel mapping to the IR.

    Attributes:
        ir_kind: Op kind of the node, a name registered in :mod:`hpcnb.ir.kinds`.
    """

    ir_kind: str

    def ir_flops(self, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> int:
        """FLOPs of one call with these input shapes and this output shape.

        Args:
            in_shapes: Shapes of the tensor inputs, in argument order.
            out_shape: Shape of the (first) output tensor.
        """
        ...

    def ir_channels(self, ctx: ChannelAnalysis, in_axes: list[Any]) -> Any:
        """Tie parameter axes to input axes through ``ctx``; return the output's axes.

        Args:
            ctx: The channel analysis, with parameter names relative to this module.
            in_axes: Per input, its per-axis segment lists (None for non-tensors).
        """
        ...

    def ir_refresh(self) -> None:
        """Recompute size attributes from the (sliced) parameters."""
        ...


def is_ir_leaf(module: object) -> TypeGuard[IRLeaf]:
    """Whether ``module`` implements :class:`IRLeaf` (all four members, ``ir_kind`` a string).

    Args:
        module: Any object (usually a module of the traced model).
    """
    return isinstance(getattr(module, "ir_kind", None), str) and isinstance(module, IRLeaf)
