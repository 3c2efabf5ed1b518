"""One signature for every Winograd target, and the table of targets.

Every target (Numba CPU in :mod:`~hpcnb.winograd.conv`, ``numba.cuda`` in
:mod:`~hpcnb.winograd.cuda`, OpenCL in :mod:`~hpcnb.winograd.opencl`) is a
:class:`Backend`: a function ``run(x, w, padding, config, **options)`` on float32 NumPy
arrays with checked shapes, its untuned configuration and an availability test. Its
module registers it (:func:`register_backend`) and offers one public function with the
one signature, a thin call of :func:`convolve`::

    conv2d_winograd_<target>(x, w, padding=0, config=None, *, m=None, <target options>)

which takes a ``torch.Tensor`` or a NumPy array and returns an ``(N, K, Ho, Wo)`` float32
output of the same kind. Adding a target is one new module: its kernel source (from the
shared bodies of :mod:`~hpcnb.winograd.codegen`), its ``run`` and one
:func:`register_backend` call.

Example:
    >>> import numpy as np
    >>> from hpcnb.winograd.backend import Backend, convolve, register_backend
    >>> from hpcnb.winograd.config import WinogradConfig
    >>> from hpcnb.winograd.numerics import winograd_reference
    >>> def run(x, w, padding, config):
    ...     return winograd_reference(x, w, config.m, padding, config.points)
    >>> _ = register_backend(Backend("numpy", run, lambda r: WinogradConfig(m=2)))
    >>> x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    >>> convolve(x, w, padding=1, target="numpy")[0, 0].round(3)
    array([[4., 6., 6., 4.],
           [6., 9., 9., 6.],
           [6., 9., 9., 6.],
           [4., 6., 6., 4.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hpcnb.errors import HpcnbError
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.transforms import validate_mr

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "backend_names",
    "check_conv_args",
    "convolve",
    "get_backend",
    "register_backend",
]


class BackendUnavailableError(HpcnbError, RuntimeError):
    """A target cannot run here (no GPU, no OpenCL device); the message says what to install."""


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Backend:
    """A Winograd target: how to run one convolution on it.

    Attributes:
        name: Key in the table of targets (``"cpu"``, ``"cuda"``, ``"opencl"``).
        run: ``run(x, w, padding, config, **options)`` on C-contiguous arrays whose
            shapes are already checked: ``x`` ``(N, C, H, W)`` float32, ``w`` ``(K, C, r, r)``
            as given (filters are transformed in float64), a complete configuration;
            returns the ``(N, K, Ho, Wo)`` float32 array.
        default_config: ``default_config(r)``: the target's untuned configuration.
        available: ``available()``: True when the target can run in this process.
        requirement: What makes it available (shown when it is not).
    """

    name: str
    run: Callable[..., np.ndarray]
    default_config: Callable[[int], WinogradConfig]
    available: Callable[[], bool] = _always
    requirement: str = ""


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Add ``backend`` to the table of targets.

    Args:
        backend: The target.
        replace: Replace a registered target of the same name (refused otherwise).

    Returns:
        ``backend``, so a module can write ``TARGET = register_backend(Backend(...))``.

    Raises:
        WinogradError: ``backend`` is not a :class:`Backend`, has no name, or its name is
            taken and ``replace`` is not set.
    """
    if not isinstance(backend, Backend) or not backend.name:
        raise WinogradError(f"register_backend: expected a named Backend, got {backend!r}")
    if backend.name in _BACKENDS and not replace:
        raise WinogradError(
            f"register_backend: a target named {backend.name!r} is registered already; "
            "pass replace=True to replace it"
        )
    _BACKENDS[backend.name] = backend
    return backend


def backend_names() -> tuple[str, ...]:
    """Names of the registered targets, in registration order."""
    return tuple(_BACKENDS)


def get_backend(name: str) -> Backend:
    """Return the registered target ``name``.

    Raises:
        WinogradError: No target of that name (the message lists the registered ones).
    """
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise WinogradError(
            f"Winograd target {name!r} is not registered (a target registers when its module "
            f"is imported); registered: {list(_BACKENDS)}"
        ) from None


def check_conv_args(x_shape: tuple, w_shape: tuple, padding: int) -> tuple[int, int]:
    """Validate convolution shapes; return the output size ``(Ho, Wo)``.

    Args:
        x_shape: Input shape, expected ``(N, C, H, W)``.
        w_shape: Filter shape, expected ``(K, C, r, r)``.
        padding: Zero padding on every side (int >= 0).

    Returns:
        ``(Ho, Wo)``.

    Raises:
        ValueError: With the offending parameter named.
    """
    if len(x_shape) != 4:
        raise WinogradError(
            f"conv2d_winograd: x must be 4-D (N, C, H, W), got shape {tuple(x_shape)}"
        )
    if len(w_shape) != 4:
        raise WinogradError(
            f"conv2d_winograd: w must be 4-D (K, C, r, r), got shape {tuple(w_shape)}"
        )
    if w_shape[2] != w_shape[3]:
        raise WinogradError(
            f"conv2d_winograd: w must have a square r x r filter, got {tuple(w_shape)}"
        )
    if x_shape[1] != w_shape[1]:
        raise WinogradError(
            f"conv2d_winograd: channels of x ({x_shape[1]}) and w ({w_shape[1]}) differ"
        )
    if min(x_shape) < 1 or min(w_shape) < 1:
        raise WinogradError(
            f"conv2d_winograd: empty tensor, x {tuple(x_shape)}, w {tuple(w_shape)}"
        )
    if isinstance(padding, bool) or not isinstance(padding, int | np.integer) or padding < 0:
        raise WinogradError(f"conv2d_winograd: padding must be an int >= 0, got {padding!r}")
    r = w_shape[2]
    Ho, Wo = x_shape[2] + 2 * padding - r + 1, x_shape[3] + 2 * padding - r + 1
    if Ho < 1 or Wo < 1:
        raise WinogradError(
            f"conv2d_winograd: image {x_shape[2]}x{x_shape[3]} with padding {padding} is "
            f"smaller than the {r}x{r} filter"
        )
    return Ho, Wo


def _as_array(t: Any, dtype: type | None = None) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.ascontiguousarray(t, dtype=dtype)


def convolve(
    x: Any,
    w: Any,
    padding: int = 0,
    config: WinogradConfig | None = None,
    *,
    target: str = "cpu",
    m: int | None = None,
    **options: Any,
) -> Any:
    """Stride-1 2-D Winograd convolution on a registered target, like ``F.conv2d``.

    Args:
        x: Input ``(N, C, H, W)``, a ``torch.Tensor`` or NumPy array (computed in float32).
        w: Filters ``(K, C, r, r)``.
        padding: Zero padding on every side.
        config: The configuration (None: the target's default configuration).
        target: Name of a registered target (:func:`backend_names`).
        m: Outputs per tile side; overrides the configuration's ``m``.
        **options: Target-specific options passed to its ``run``.

    Returns:
        Output ``(N, K, Ho, Wo)`` float32, a tensor when ``x`` is one, else an array.

    Raises:
        ValueError: Invalid shapes, padding, m, config or target.
        BackendUnavailableError: The target cannot run here.
    """
    backend = get_backend(target)
    xa, wa = _as_array(x, np.float32), _as_array(w)
    check_conv_args(xa.shape, wa.shape, padding)
    r = int(wa.shape[2])
    if m is not None:
        validate_mr(m, r)
    if config is not None and not isinstance(config, WinogradConfig):
        raise WinogradError(f"{target}: config must be a WinogradConfig or None, got {config!r}")
    config = config or backend.default_config(r)
    if m is not None:
        config = replace(config, m=m)
    validate_mr(config.m, r)
    if not backend.available():
        raise BackendUnavailableError(
            f"Winograd target {target!r} is not available here: {backend.requirement}"
        )
    out = backend.run(xa, wa, padding, config, **options)
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.from_numpy(out)
    return out
