"""The kernels PyTorch runs for a network: ATen calls captured, described and replayed.

A network's forward pass (and, for training, its backward pass and optimizer step) reaches
the CPU as a sequence of ATen operator calls. :func:`capture` records that sequence under a
``TorchDispatchMode``: each :class:`KernelCall` keeps the operator's name and a description
of its arguments (tensor shapes, dtypes and strides; the plain values as given), nothing of
the data. From a call:

* :func:`kernel_features` reads the features its predictor needs: a convolution's batch,
  channels, image size, kernel, stride and groups (forward and backward alike); a matrix
  product's three sizes; for every other operator the elements it reads and writes, the
  channel count of a 4-d input, the product of its window (pooling) arguments and its boolean
  arguments as bits (a batch norm in training mode computes statistics, in eval mode not);
* :func:`replay` builds random tensors of the recorded layouts and returns a callable that
  runs the operator alone on them, so that each kernel can be timed by itself.

:func:`network_kernels` captures a network's inference pass (``no_grad``, ``eval()``) or
one training step (forward, cross-entropy, backward, ``SGD(momentum=0.9).step()``), the
same work :mod:`hpcnb.perfmodel.timing` times.

Example:
    >>> from torch import nn
    >>> calls = network_kernels(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), (3, 8, 8), 2)
    >>> [c.op for c in calls]
    ['aten.convolution.default', 'aten.relu.default']
    >>> kernel_features(calls[0])
    ('conv', (2.0, 3.0, 8.0, 8.0, 8.0, 9.0, 1.0, 1.0, 1.0))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = [
    "CONV_FEATURES",
    "GEMM_FEATURES",
    "GENERIC_FEATURES",
    "KernelCall",
    "TensorSpec",
    "capture",
    "kernel_features",
    "network_kernels",
    "replay",
]

#: Features of a convolution kernel (forward or backward): batch, input channels, input
#: height and width, output channels, kernel elements, stride, groups, and the number of
#: gradients a backward call computes (1 for a forward call).
CONV_FEATURES = (
    "batch",
    "c_in",
    "height",
    "width",
    "c_out",
    "kernel",
    "stride",
    "groups",
    "outputs",
)
#: Features of a matrix product ``(m, k) @ (k, n)``.
GEMM_FEATURES = ("m", "k", "n")
#: Features of every other kernel (each plus one, so that they are positive).
GENERIC_FEATURES = ("elements_in", "elements_out", "channels", "window", "flags")

_CONV_OPS = ("aten.convolution.default", "aten.convolution_backward.default")
_GEMM_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument's layout, without its data.

    Attributes:
        shape: Sizes.
        stride: Strides in elements.
        dtype: Element type.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        return math.prod(self.shape)

    def make(self, generator: torch.Generator) -> torch.Tensor:
        """A tensor of this layout with random contents (ones for bool, zeros for ints).

        Args:
            generator: Source of the random values.
        """
        storage = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True))
        if self.dtype.is_floating_point:
            base = torch.randn(max(storage, 1), generator=generator, dtype=self.dtype)
        elif self.dtype == torch.bool:
            base = torch.ones(max(storage, 1), dtype=torch.bool)
        else:
            base = torch.zeros(max(storage, 1), dtype=self.dtype)
        if any(s == 0 for s in self.shape):
            return torch.empty(self.shape, dtype=self.dtype)
        return base.as_strided(self.shape, self.stride)


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.dtype)
    return value


@dataclass(frozen=True)
class KernelCall:
    """One ATen operator call of a captured run.

    Attributes:
        op: The operator's name, e.g. ``"aten.convolution.default"``.
        args: Positional arguments, tensors replaced by :class:`TensorSpec`.
        kwargs: Keyword arguments, likewise.
        outputs: Specs of the tensors the call returned.
    """

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: tuple[TensorSpec, ...]
    func: Any = None

    def tensors(self) -> list[TensorSpec]:
        """Every tensor argument's spec, in order (lists of tensors flattened)."""
        leaves, _ = tree_flatten((self.args, self.kwargs))
        return [v for v in leaves if isinstance(v, TensorSpec)]

    @property
    def key(self) -> tuple[str, str]:
        """A hashable identity of the call (operator and argument description)."""
        return self.op, repr((self.args, sorted(self.kwargs.items())))


class _Recorder(TorchDispatchMode):
    """Records every ATen call made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[KernelCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves, _ = tree_flatten(out)
        outputs = tuple(_spec(v) for v in leaves if isinstance(v, torch.Tensor))
        self.calls.append(
            KernelCall(
                str(func),
                tuple(tree_map(_spec, list(args))),
                dict(tree_map(_spec, dict(kwargs))),
                outputs,
                func,
            )
        )
        return out


def capture(run: Callable[[], object]) -> list[KernelCall]:
    """The ATen calls ``run()`` makes, in order.

    Args:
        run: Does the work once (its result is discarded).
    """
    recorder = _Recorder()
    with recorder:
        run()
    return recorder.calls


def network_kernels(
    model: nn.Module,
    input_shape: Sequence[int],
    batch: int,
    mode: str = "inference",
    *,
    seed: int = 0,
) -> list[KernelCall]:
    """The ATen calls of one inference pass or one training step of ``model``.

    A training step is captured after one untimed step, so that the optimizer's momentum
    buffers exist as they do in a timed step. ``model`` is left in the mode it was put in
    (``eval()`` for inference, ``train()`` for training); for training, its parameters have
    taken one or two SGD steps on random data.

    Args:
        model: The network.
        input_shape: One sample's shape, e.g. ``(3, 32, 32)``.
        batch: Batch size.
        mode: ``"inference"`` or ``"training"``.
        seed: Seed of the random input.

    Raises:
        PerfmodelError: An unknown mode or a batch below 1.
    """
    if mode not in ("inference", "training") or batch < 1:
        raise PerfmodelError(
            f"network_kernels: mode={mode!r} (inference or training), batch={batch} (>= 1)"
        )
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *input_shape, generator=gen)
    if mode == "inference":
        model.eval()
        with torch.no_grad():
            return capture(lambda: model(x))
    model.train()
    out = model(x[:1]) if batch > 1 else model(x)
    y = torch.randint(0, int(out.shape[-1]), (batch,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()
    return capture(step)


def _conv_features(call: KernelCall) -> tuple[float, ...]:
    tensors = call.tensors()
    if call.op == _CONV_OPS[0]:
        x, w = tensors[0], tensors[1]
        stride, groups, outputs = call.args[3], call.args[8], 1
    else:  # grad_output, input, weight, bias_sizes, stride, padding, dilation, ..., groups, mask
        x, w = tensors[1], tensors[2]
        stride, groups = call.args[4], call.args[9]
        outputs = sum(bool(m) for m in call.args[10])
    if len(x.shape) != 4:
        raise PerfmodelError(f"{call.op}: only 2-d convolutions are described (input {x.shape})")
    n, c, h, wd = x.shape
    return (
        float(n),
        float(c),
        float(h),
        float(wd),
        float(w.shape[0]),
        float(math.prod(w.shape[2:])),
        float(stride[0]),
        float(groups),
        float(max(outputs, 1)),
    )


def _gemm_features(call: KernelCall) -> tuple[float, ...]:
    tensors = call.tensors()
    a, b = (tensors[1], tensors[2]) if call.op == "aten.addmm.default" else (tensors[0], tensors[1])
    batch = a.shape[0] if len(a.shape) == 3 else 1
    m, k = a.shape[-2], a.shape[-1]
    return float(m * batch), float(k), float(b.shape[-1])


def kernel_features(call: KernelCall) -> tuple[str, tuple[float, ...]]:
    """The kernel's predictor family and its feature values (all positive).

    Returns ``("conv", CONV_FEATURES values)`` for convolutions (forward and backward),
    ``("gemm", GEMM_FEATURES values)`` for matrix products, else
    ``("generic", GENERIC_FEATURES values)``, each value plus one.

    Args:
        call: A captured call.

    Raises:
        PerfmodelError: A convolution that is not 2-d.
    """
    if call.op in _CONV_OPS:
        return "conv", _conv_features(call)
    if call.op in _GEMM_OPS:
        return "gemm", _gemm_features(call)
    tensors = call.tensors()
    first4 = next((t for t in tensors if len(t.shape) == 4), None)
    ints = [
        v
        for v in call.args
        if isinstance(v, (list, tuple)) and v and all(isinstance(i, int) for i in v)
    ]
    window = math.prod(ints[0]) if ints and call.op.split(".")[1].find("pool") >= 0 else 1
    flags = sum(1 << i for i, v in enumerate(a for a in call.args if isinstance(a, bool)) if v)
    return "generic", (
        1.0 + sum(t.numel for t in tensors),
        1.0 + sum(t.numel for t in call.outputs),
        1.0 + (first4.shape[1] if first4 is not None else 0),
        float(max(window, 1)),
        1.0 + flags,
    )


def _resolve(op: str) -> Any:
    namespace, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def replay(call: KernelCall, *, seed: int = 0) -> Callable[[], object]:
    """A callable that runs the call's operator alone on random tensors of its layouts.

    The tensors are made once; in-place operators run on them again at every call (their
    cost does not depend on the values).

    Args:
        call: A captured call.
        seed: Seed of the random contents.

    Raises:
        PerfmodelError: The operator cannot be resolved or fails on the replayed arguments
            (the message names it).
    """
    gen = torch.Generator().manual_seed(seed)

    def make(v: Any) -> Any:
        return v.make(gen) if isinstance(v, TensorSpec) else v

    try:
        func = call.func if call.func is not None else _resolve(call.op)
        args = tree_map(make, list(call.args))
        kwargs = tree_map(make, dict(call.kwargs))
        with torch.no_grad():
            func(*args, **kwargs)
    except (RuntimeError, AttributeError, TypeError, ValueError, IndexError) as exc:
        raise PerfmodelError(f"replay: {call.op} fails on its recorded layouts: {exc}") from exc

    def run() -> object:
        with torch.no_grad():
            return func(*args, **kwargs)

    return run
