"""Working around a PyTorch CPU backend fault on some machines.

The oneDNN release inside ``torch==2.13.0`` (oneDNN 3.12) picks its ``jit_1x1:avx2``
kernel for the weight gradient of 1×1 convolutions on CPUs whose best instruction set is
AVX2; with a stride of 2 and channel counts that are not multiples of 8 (pruned networks,
supernet slices) that kernel corrupts the heap, and the process aborts later in
``free()``. The forward pass and the other gradients are not affected. Where the CPU
capability is AVX2, :func:`safe_backward` runs a backward pass with oneDNN off, so
PyTorch's own convolution kernels compute the gradients; elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

__all__ = ["onednn_backward_unsafe", "safe_backward"]


@functools.cache
def onednn_backward_unsafe() -> bool:
    """Whether this CPU gets oneDNN's AVX2 kernels (where its 1x1 weight gradient faults)."""
    import torch

    return torch.backends.mkldnn.is_available() and torch.backends.cpu.get_cpu_capability() == (
        "AVX2"
    )


@contextlib.contextmanager
def safe_backward() -> Iterator[None]:
    """Run the enclosed backward pass without oneDNN where its AVX2 kernel faults.

    Example:
        >>> import torch
        >>> w = torch.ones(2, requires_grad=True)
        >>> with safe_backward():
        ...     (w * 3).sum().backward()
        >>> w.grad.tolist()
        [3.0, 3.0]
    """
    if not onednn_backward_unsafe():
        yield
        return
    import torch

    with torch.backends.mkldnn.flags(enabled=False):
        yield
