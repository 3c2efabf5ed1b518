"""Features of a network for runtime prediction: FLOPs, bytes, parameters, layer counts.

Forward features come from the graph IR (:func:`hpcnb.ir.trace`): FLOPs by op kind (a
multiply-add counts 2), parameters, activation memory (bytes of every node's output),
bytes read and written, and node counts by kind. Convolutions are split into dense
(``groups == 1``) and grouped/depthwise ones, which run far below peak on every machine.
How a node counts - its op group, whether it is a matrix product, whether it launches a
kernel - is read from the IR's kinds table (:mod:`hpcnb.ir.kinds`), so a kind registered
there reaches these features as it is.

Training FLOPs are *measured* with :class:`torch.utils.flop_counter.FlopCounterMode`
around forward and backward of a cross-entropy loss in train mode (not a fixed 3× of the
forward). torch's stock formula for ``aten.convolution_backward`` ignores ``groups`` in the
weight-gradient term and so overcounts a depthwise convolution's backward by a factor of
about its channel count; :func:`training_flops` registers a corrected formula (the
weight-gradient term divided by ``groups``), checked against the forward count in tests.

Every cost that grows with the batch is stored *per sample* (traced at batch 2, divided
by 2), so one trace serves every batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from hpcnb.ir.kinds import Kind, get_kind
from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = [
    "OP_GROUPS",
    "op_group",
    "NetworkFeatures",
    "cache_bytes_per_core",
    "corrected_conv_backward_flop",
    "network_features",
    "training_flops",
]

# The op groups of the per-op-kind model (:class:`hpcnb.perfmodel.opmodel.OpCostModel`):
# dense convolutions and linear layers, grouped/depthwise convolutions, normalisations,
# activations, pooling, and element-wise / data-movement ops (add, mul, concat, ...).
OP_GROUPS = ("dense", "grouped", "norm", "activation", "pool", "elementwise")

# Kind groups (hpcnb.ir.kinds.GROUPS) executed as (batched) matrix products.
_GEMM_GROUPS = ("conv", "matmul")


def _is_gemm(kind: Kind) -> bool:
    return kind.group in _GEMM_GROUPS


def op_group(kind: str, grouped_conv: bool = False) -> str:
    """The op group (:data:`OP_GROUPS`) of an IR node kind, from the IR's kinds table.

    A kind of group ``conv`` is ``dense`` or ``grouped``, one of group ``matmul`` is
    ``dense``; the other groups of :mod:`hpcnb.ir.kinds` are op groups of their own.

    Args:
        kind: The IR op kind (``"conv"``, ``"norm"``, ...).
        grouped_conv: The node is a convolution with ``groups > 1``.

    Raises:
        UnknownKindError: ``kind`` is not registered in :mod:`hpcnb.ir.kinds`.

    Example:
        >>> op_group("conv"), op_group("conv", grouped_conv=True), op_group("concat")
        ('dense', 'grouped', 'elementwise')
    """
    group = get_kind(kind, where="op_group").group
    if group == "conv":
        return "grouped" if grouped_conv else "dense"
    if group == "matmul":
        return "dense"
    return group


def cache_bytes_per_core(default: int = 1 << 20) -> int:
    """Return the per-core L2 cache size from sysfs (``default`` when unknown).

    Args:
        default: Bytes returned when sysfs does not say.
    """
    from pathlib import Path

    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            level = (index / "level").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        if level == "2" and size:
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            factor = units.get(size[-1], 1)
            return int(float(size.rstrip("KMG")) * factor)
    return default


def corrected_conv_backward_flop(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    groups: int,
    output_mask: list[bool],
    out_shape: list[Any],
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten.convolution_backward`` with the weight gradient divided by ``groups``.

    The input gradient is a (transposed) convolution of the output gradient with the
    weight, whose shape already carries ``c_in / groups``; the weight gradient convolves
    input and output gradient *within each group*, so the dense count is ``groups`` times
    too large. The arguments are those of ``aten.convolution_backward`` (as
    ``FlopCounterMode`` passes them, shapes instead of tensors).

    Args:
        grad_out_shape: Shape of the output gradient.
        x_shape: Shape of the convolution's input.
        w_shape: Shape of the weight.
        _bias: Bias sizes (unused).
        _stride: Strides (unused).
        _padding: Padding (unused).
        _dilation: Dilation (unused).
        transposed: Whether the convolution is transposed.
        _output_padding: Output padding (unused).
        groups: The convolution's groups.
        output_mask: Which of (input, weight, bias) gradients are computed.
        out_shape: Shapes of the computed gradients, in that order.
        **kwargs: Further arguments ``FlopCounterMode`` passes (unused).

    Returns:
        FLOPs of the input and weight gradients.
    """

    def swap(shape: list[int]) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, list(out_shape[0]), not transposed)
    if output_mask[1]:
        gw = list(out_shape[1])
        if transposed:
            dense = conv_flop_count(swap(grad_out_shape), swap(x_shape), swap(gw), False)
        else:
            dense = conv_flop_count(swap(x_shape), swap(grad_out_shape), swap(gw), False)
        flops += dense // max(int(groups), 1)
    return flops


def _is_grouped_conv(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1


def training_flops(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None
) -> tuple[int, int]:
    """Measure forward + backward FLOPs of one training step with ``FlopCounterMode``.

    Args:
        model: The network (set to train mode; gradients are cleared afterwards).
        x: Input batch.
        y: Class labels (random ones for the model's output width when ``None``).

    Returns:
        ``(total, grouped)``: all FLOPs, and those of grouped/depthwise convolutions.
    """
    model.train()
    mapping = {torch.ops.aten.convolution_backward: corrected_conv_backward_flop}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        out = model(x)
        if y is None:
            y = torch.zeros(out.shape[0], dtype=torch.long)
        nn.functional.cross_entropy(out, y).backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts()
    prefix = type(model).__name__
    grouped = 0
    for name, module in model.named_modules():
        if name and _is_grouped_conv(module):
            grouped += sum(counts.get(f"{prefix}.{name}", {}).values())
    return int(counter.get_total_flops()), int(grouped)


@dataclass(frozen=True)
class NetworkFeatures:
    """Per-sample costs of one network at one input size.

    Attributes:
        name: Configuration name (e.g. ``"resnet_w0.5_r32"``).
        family: Architecture family (the unit of leave-one-family-out evaluation).
        input_shape: Shape of one sample ``(C, H, W)``.
        params: Parameter count.
        conv_flops: Forward FLOPs of dense convolutions per sample.
        grouped_conv_flops: Forward FLOPs of grouped/depthwise convolutions per sample.
        linear_flops: Forward FLOPs of linear, matmul and attention nodes per sample.
        other_flops: Forward FLOPs of every other node per sample (norms, activations, ...).
        activation_bytes: Bytes of all node outputs per sample (activation memory).
        memory_bytes: Bytes read plus written by all nodes per sample.
        train_flops: Measured forward + backward FLOPs per sample.
        train_grouped_flops: The part of ``train_flops`` in grouped convolutions.
        counts: Node counts by op kind (batch-independent).
        gemm_node_bytes: Per-sample bytes read plus written by each convolution, linear and
            matmul node (used to tell which nodes' working sets fit in cache).
        other_node_bytes: The same for every other kernel-launching node.
        group_costs: Per op group (:data:`OP_GROUPS`): ``(launches, FLOPs per sample,
            bytes read plus written per sample)`` of its kernel-launching nodes.
        param_tensors: Number of parameter tensors (one optimizer update each).
    """

    name: str
    family: str
    input_shape: tuple[int, ...]
    params: int
    conv_flops: float
    grouped_conv_flops: float
    linear_flops: float
    other_flops: float
    activation_bytes: float
    memory_bytes: float
    train_flops: float
    train_grouped_flops: float
    counts: dict[str, int] = field(default_factory=dict)
    gemm_node_bytes: tuple[float, ...] = ()
    other_node_bytes: tuple[float, ...] = ()
    group_costs: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    param_tensors: int = 0

    @property
    def forward_flops(self) -> float:
        """All forward FLOPs per sample."""
        return self.conv_flops + self.grouped_conv_flops + self.linear_flops + self.other_flops

    @property
    def kernels(self) -> int:
        """Number of nodes that launch a compute kernel (per forward pass).

        Raises:
            UnknownKindError: ``counts`` names a kind that is not registered.
        """
        return sum(v for k, v in self.counts.items() if get_kind(k, where="kernels").kernel)

    @property
    def gemm_kernels(self) -> int:
        """Number of convolution, linear, matmul and attention nodes.

        Raises:
            UnknownKindError: ``counts`` names a kind that is not registered.
        """
        return sum(v for k, v in self.counts.items() if _is_gemm(get_kind(k, where="kernels")))

    def split_bytes(self, batch: int, cache_bytes: float) -> tuple[float, float, float, float]:
        """Bytes moved at ``batch``, split by node type and by whether a node fits in cache.

        A node's working set is its bytes read plus written at this batch; it counts as
        cache-resident when that is below ``cache_bytes``.

        Args:
            batch: The batch size.
            cache_bytes: Working sets below this many bytes count as cache-resident.

        Returns:
            ``(gemm_in_cache, gemm_spilling, other_in_cache, other_spilling)`` in bytes.
        """
        out = []
        for per_node in (self.gemm_node_bytes, self.other_node_bytes):
            sizes = [batch * b for b in per_node]
            out.append(sum(v for v in sizes if v < cache_bytes))
            out.append(sum(v for v in sizes if v >= cache_bytes))
        return out[0], out[1], out[2], out[3]

    def to_json(self) -> dict[str, Any]:
        """Return plain JSON-able data (inverse of :meth:`from_json`)."""
        out = dict(self.__dict__)
        out["input_shape"] = list(self.input_shape)
        out["counts"] = dict(self.counts)
        out["gemm_node_bytes"] = list(self.gemm_node_bytes)
        out["other_node_bytes"] = list(self.other_node_bytes)
        out["group_costs"] = {k: list(v) for k, v in self.group_costs.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NetworkFeatures:
        """Rebuild features from :meth:`to_json` output."""
        data = dict(data)
        data["input_shape"] = tuple(data["input_shape"])
        data["gemm_node_bytes"] = tuple(data.get("gemm_node_bytes", ()))
        data["other_node_bytes"] = tuple(data.get("other_node_bytes", ()))
        data["group_costs"] = {
            k: tuple(float(x) for x in v) for k, v in data.get("group_costs", {}).items()
        }
        return cls(**data)


def network_features(
    model: nn.Module,
    input_shape: tuple[int, ...],
    name: str = "",
    family: str = "",
    trace_batch: int = 2,
    training: bool = True,
) -> NetworkFeatures:
    """Compute the features of ``model`` for samples of ``input_shape``.

    Args:
        model: The network.
        input_shape: One sample's shape, e.g. ``(3, 32, 32)``.
        name: Configuration name.
        family: Architecture family.
        trace_batch: Batch used for tracing and FLOP counting (≥ 2 so that BatchNorm in
            train mode works); per-sample values are divided by it.
        training: Measure training FLOPs (one forward + backward under
            ``FlopCounterMode``); when False they are left at 0 (enough for inference).

    Raises:
        PerfmodelError: ``trace_batch`` below 2, or the IR reports unsupported nodes.
        UnknownKindError: A node's kind is not registered in :mod:`hpcnb.ir.kinds`.
    """
    from hpcnb.ir import trace

    if trace_batch < 2:
        raise PerfmodelError(f"trace_batch={trace_batch}: expected >= 2 (BatchNorm in train mode)")
    x = torch.randn(trace_batch, *input_shape)
    model.eval()
    with torch.no_grad():
        graph = trace(model, x)
    unsupported = graph.unsupported()
    if unsupported:
        names = ", ".join(f"{n.name} ({n.module or n.op})" for n in unsupported[:5])
        raise PerfmodelError(f"{name or type(model).__name__}: IR cannot cost nodes: {names}")
    conv = grouped = linear = other = 0
    gemm_bytes: list[float] = []
    other_bytes: list[float] = []
    groups = {g: [0.0, 0.0, 0.0] for g in OP_GROUPS}
    modules = dict(model.named_modules())
    for node in graph.nodes:
        kind = get_kind(node.kind, where=f"node {node.name!r}")
        moved = (node.bytes_read + node.bytes_written) / trace_batch
        module = modules.get(node.module) if node.module else None
        is_grouped = module is not None and _is_grouped_conv(module)
        if kind.kernel:
            (gemm_bytes if _is_gemm(kind) else other_bytes).append(moved)
            cost = groups[op_group(node.kind, is_grouped)]
            cost[0] += 1
            cost[1] += node.flops / trace_batch
            cost[2] += moved
        if kind.group == "conv":
            if is_grouped:
                grouped += node.flops
            else:
                conv += node.flops
        elif kind.group == "matmul":
            linear += node.flops
        else:
            other += node.flops
    memory = sum(n.bytes_read + n.bytes_written for n in graph.nodes)
    train, train_grouped = training_flops(model, x) if training else (0, 0)
    model.eval()
    b = float(trace_batch)
    return NetworkFeatures(
        name=name,
        family=family,
        input_shape=tuple(int(s) for s in input_shape),
        params=int(graph.total_params()),
        conv_flops=conv / b,
        grouped_conv_flops=grouped / b,
        linear_flops=linear / b,
        other_flops=other / b,
        activation_bytes=graph.activation_bytes() / b,
        memory_bytes=memory / b,
        train_flops=train / b,
        train_grouped_flops=train_grouped / b,
        counts=dict(graph.count_by_kind()),
        gemm_node_bytes=tuple(gemm_bytes),
        other_node_bytes=tuple(other_bytes),
        group_costs={g: (v[0], v[1], v[2]) for g, v in groups.items()},
        param_tensors=sum(1 for p in model.parameters() if p.requires_grad),
    )
