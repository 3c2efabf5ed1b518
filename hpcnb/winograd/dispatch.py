"""Per-layer choice between the Winograd kernel and PyTorch's own convolution.

Winograd's arithmetic saving does not always survive on a CPU: with few tiles (small
images, batch 1) the ``n²`` GEMMs are narrow and the transformed filters (``n² K C``
floats, 36 MB at 512 channels with ``F(4,3)``) must stream from memory for little work,
while oneDNN's direct convolution runs near the core's peak. So, as MNN does with its
cost model, ``conv2d_winograd(..., fallback=True)`` runs a layer by Winograd only where
that was measured to be faster, and by ``torch.nn.functional.conv2d`` otherwise.

The choice for one layer shape and thread count is a :class:`PathChoice`, from (first
found): one given with :func:`remember_choice`; the tuner's wisdom when its entry
holds a measurement of torch beside the tuned configuration (``torch_s``, see
:func:`~hpcnb.winograd.autotune.autotune`); else a short measurement on random data made
on first use (:func:`measure_choice`: both timed in interleaved rounds). It is kept
for the rest of the process. :func:`choose_path` is the rule: Winograd when torch's
time is at least :data:`MARGIN` times Winograd's, so a layer where the two are within
the measurement's noise runs torch's convolution.

Example:
    >>> from hpcnb.winograd.dispatch import choose_path
    >>> choose_path(winograd_s=1.0e-3, torch_s=2.0e-3), choose_path(2.0e-3, 2.0e-3)
    ('winograd', 'torch')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcnb.timing import interleaved
from hpcnb.winograd.config import WinogradConfig, WinogradError

__all__ = [
    "MARGIN",
    "PathChoice",
    "choose_path",
    "clear_choices",
    "known_choice",
    "measure_choice",
    "remember_choice",
    "torch_conv2d",
    "wisdom_choice",
]

MARGIN = 1.10
"""Torch time over Winograd time needed to choose Winograd (a tie runs torch).

The tuner's final rounds of a 1-2 ms layer spread by about ±10 % on a quiet 2-core
machine, so a smaller measured gain is not evidence that Winograd is faster."""

PATHS: tuple[str, ...] = ("winograd", "torch")


def choose_path(winograd_s: float, torch_s: float, margin: float = MARGIN) -> str:
    """``"winograd"`` when ``torch_s >= margin * winograd_s``, else ``"torch"``.

    Args:
        winograd_s: Seconds of the Winograd kernel (median).
        torch_s: Seconds of torch's convolution (median, same rounds).
        margin: Required speed-up of Winograd, at least 1.

    Raises:
        WinogradError: A time that is not a finite positive number, or ``margin`` < 1.
    """
    for name, v in (("winograd_s", winograd_s), ("torch_s", torch_s)):
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise WinogradError(f"choose_path: {name} must be a finite time > 0, got {v!r}")
    if not margin >= 1:
        raise WinogradError(f"choose_path: margin must be >= 1, got {margin!r}")
    return "winograd" if torch_s >= margin * winograd_s else "torch"


@dataclass(frozen=True)
class PathChoice:
    """How one layer shape runs under ``fallback=True``, and the evidence for it.

    Attributes:
        path: ``"winograd"`` or ``"torch"``.
        config: The Winograd configuration that was compared.
        winograd_s: Its median seconds.
        torch_s: Torch's median seconds, measured beside it.
        source: ``"measured"`` (timed on first use), ``"wisdom"`` (the tuner's final
            measurement) or ``"given"`` (:func:`remember_choice`).
    """

    path: str
    config: WinogradConfig
    winograd_s: float
    torch_s: float
    source: str

    def __post_init__(self) -> None:
        """Check the path.

        Raises:
            WinogradError: An unknown path.
        """
        if self.path not in PATHS:
            raise WinogradError(f"PathChoice.path must be one of {PATHS}, got {self.path!r}")

    @property
    def gain(self) -> float:
        """Torch time over Winograd time (> 1: Winograd was faster)."""
        return self.torch_s / self.winograd_s


_CHOICES: dict[tuple, PathChoice] = {}


def _key(x_shape: tuple, w_shape: tuple, padding: int, threads: int) -> tuple:
    return (tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape), int(padding), threads)


def known_choice(x_shape: tuple, w_shape: tuple, padding: int, threads: int) -> PathChoice | None:
    """The choice kept in this process for a layer and thread count, or None.

    Args:
        x_shape: Input shape ``(N, C, H, W)``.
        w_shape: Filter shape ``(K, C, r, r)``.
        padding: Zero padding.
        threads: Threads the layer runs with.
    """
    return _CHOICES.get(_key(x_shape, w_shape, padding, threads))


def remember_choice(
    x_shape: tuple,
    w_shape: tuple,
    padding: int,
    threads: int,
    *,
    config: WinogradConfig,
    winograd_s: float,
    torch_s: float,
    source: str = "given",
) -> PathChoice:
    """Decide a layer's path from two costs (:func:`choose_path`) and keep it.

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        threads: Threads the layer runs with.
        config: The Winograd configuration the cost belongs to.
        winograd_s: Its cost in seconds.
        torch_s: Torch's cost in seconds.
        source: Where the costs come from (``"given"``, ``"wisdom"``, ``"measured"``).

    Returns:
        The kept choice.
    """
    choice = PathChoice(choose_path(winograd_s, torch_s), config, winograd_s, torch_s, source)
    _CHOICES[_key(x_shape, w_shape, padding, threads)] = choice
    return choice


def clear_choices() -> None:
    """Forget every kept choice (the next ``fallback=True`` call decides again)."""
    _CHOICES.clear()


def torch_conv2d(x: Any, w: Any, padding: int) -> Any:
    """``torch.nn.functional.conv2d`` in float32 (stride 1, no bias), tensors or arrays.

    Args:
        x: Input ``(N, C, H, W)``: a ``torch.Tensor`` (used as it is when float32) or an
            array.
        w: Filters ``(K, C, r, r)``, likewise.
        padding: Zero padding.

    Returns:
        The ``(N, K, Ho, Wo)`` float32 output: a tensor when ``x`` is one, else an array.
    """
    import torch
    import torch.nn.functional as F

    as_tensor = isinstance(x, torch.Tensor)
    xt = x.float() if as_tensor else torch.from_numpy(np.ascontiguousarray(x, np.float32))
    wt = w.float() if isinstance(w, torch.Tensor) else torch.from_numpy(np.asarray(w, np.float32))
    with torch.no_grad():
        y = F.conv2d(xt, wt, padding=padding)
    return y if as_tensor else y.numpy()


def measure_choice(
    x_shape: tuple,
    w_shape: tuple,
    padding: int,
    config: WinogradConfig,
    threads: int,
    *,
    winograd: Callable[[], object],
    torch: Callable[[], object],
    reps: int = 5,
) -> PathChoice:
    """Time the Winograd convolution and torch's on one layer, and keep the choice.

    Both run with ``threads`` threads (torch's pool and Numba's pinned) in ``reps``
    interleaved rounds after a warm-up round; each sample is the mean of two calls after an
    untimed one (see :func:`hpcnb.timing.interleaved`).

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        config: The Winograd configuration compared.
        threads: Threads for both.
        winograd: One Winograd convolution of the layer (filters prepared beforehand).
        torch: One ``torch.nn.functional.conv2d`` of the same data.
        reps: Interleaved rounds.

    Returns:
        The kept choice (``source="measured"``).
    """
    from hpcnb.timing import pinned_threads

    with pinned_threads(threads):
        t = interleaved(
            {"winograd": winograd, "torch": torch}, repeats=reps, warmup=1, calls=2, lead=1
        )
    return remember_choice(
        x_shape,
        w_shape,
        padding,
        threads,
        config=config,
        winograd_s=t["winograd"].median,
        torch_s=t["torch"].median,
        source="measured",
    )


def wisdom_choice(
    x_shape: tuple,
    w_shape: tuple,
    padding: int,
    threads: int,
    path: Any = None,
) -> PathChoice | None:
    """The choice from the tuner's wisdom for this machine and shape, kept; or None.

    Only an entry whose final measurement timed torch beside the tuned configuration
    (``torch_s``) decides; an entry without it, or no entry, gives None.

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        threads: Threads the layer runs with.
        path: Wisdom file (default :func:`~hpcnb.winograd.wisdom.wisdom_path`).
    """
    from hpcnb.winograd.wisdom import read_wisdom, shape_key, stored_entry

    entry = stored_entry(read_wisdom(path), shape_key(x_shape, w_shape, padding))
    if entry is None or "torch_s" not in entry:
        return None
    return remember_choice(
        x_shape,
        w_shape,
        padding,
        threads,
        config=WinogradConfig(**entry["best"]),
        winograd_s=entry["best_s"],
        torch_s=entry["torch_s"],
        source="wisdom",
    )
