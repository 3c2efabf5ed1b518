"""The Winograd targets: one :class:`Backend` per target, one registry, one call.

A target (Numba CPU in :mod:`~hpcnb.winograd.conv`, ``numba.cuda`` in
:mod:`~hpcnb.winograd.cuda`, OpenCL in :mod:`~hpcnb.winograd.opencl`, or a module of
your own) is one :class:`Backend`: how it runs a convolution (``run``), its untuned
configuration, whether it can run here and what it needs otherwise, how it chooses its
tile size, the generated kernel text it shows, and optionally a prepared plan for
repeated inputs and the rows it adds to the portability table. The module registers it
(:func:`register_backend`); :func:`conv2d_winograd` runs every target with one signature::

    conv2d_winograd(x, w, padding=0, config=None, *, target="cpu", m=None, **options)

which takes a ``torch.Tensor`` or a NumPy array and returns an ``(N, K, Ho, Wo)`` float32
output of the same kind. ``target`` is a registered name (:func:`backend_names`), a
:class:`Backend`, or a ``"package.module:attr"`` reference to one (``"package.module:"``
names a module that registers exactly one when imported, see :mod:`hpcnb.plugins`).
:func:`backends` lists the registered targets, so that tables of every target
(:mod:`~hpcnb.winograd.portability`) loop over them instead of naming them.

Example:
    >>> import numpy as np
    >>> from hpcnb.winograd.backend import Backend, conv2d_winograd, register_backend
    >>> from hpcnb.winograd.config import WinogradConfig
    >>> from hpcnb.winograd.numerics import winograd_reference
    >>> def run(x, w, padding, config):
    ...     return winograd_reference(x, w, config.m, padding, config.points)
    >>> _ = register_backend(Backend("numpy", run, lambda r: WinogradConfig(m=2)))
    >>> x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    >>> conv2d_winograd(x, w, padding=1, target="numpy")[0, 0].round(3)
    array([[4., 6., 6., 4.],
           [6., 9., 9., 6.],
           [6., 9., 9., 6.],
           [4., 6., 6., 4.]], dtype=float32)
    >>> TARGETS.unregister("numpy")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hpcnb.errors import HpcnbError
from hpcnb.plugins import Registry
from hpcnb.timing import interleaved
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.transforms import validate_mr
from hpcnb.winograd.wisdom import lookup_wisdom

__all__ = [
    "TARGETS",
    "Backend",
    "BackendUnavailableError",
    "TileChoice",
    "backend_names",
    "backends",
    "check_conv_args",
    "conv2d_winograd",
    "get_backend",
    "register_backend",
    "sweep_tiles",
    "target_options",
]

#: A prepared convolution: the input ``(N, C, H, W)`` float32 array in, the output out.
Plan = Callable[[np.ndarray], np.ndarray]


class BackendUnavailableError(HpcnbError, RuntimeError):
    """A target cannot run here (no GPU, no OpenCL device); the message says what to install."""


def _always() -> bool:
    return True


@dataclass(frozen=True)
class TileChoice:
    """A target's choice of the tile size ``m`` for one layer, measured or modelled.

    Attributes:
        target: Where the choice holds: the target's label, with the device or the
            architecture when that matters.
        best_m: The fastest tile size.
        seconds: Median (measured) or modelled seconds per tile size.
        measured: True when timed here, False when modelled.
        detail: More facts per tile size (e.g. the occupancy behind a modelled time).
    """

    target: str
    best_m: int
    seconds: dict[int, float]
    measured: bool
    detail: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """A Winograd target: everything the package needs to run, tune and show it.

    Attributes:
        name: Key in the registry (``"cpu"``, ``"cuda"``, ``"opencl"``).
        run: ``run(x, w, padding, config, **options)`` on C-contiguous arrays whose
            shapes are already checked: ``x`` ``(N, C, H, W)`` float32, ``w`` ``(K, C, r, r)``
            as given (filters are transformed in float64), a complete configuration;
            returns the ``(N, K, Ho, Wo)`` float32 array.
        default_config: ``default_config(r)``: the target's untuned configuration.
        available: ``available()``: True when the target can run in this process.
        requirement: What makes it available (shown when it is not).
        label: Name shown in tables (default: ``name``).
        excerpt: ``excerpt(m, r, lines, **options)`` -> ``{title: text}``: the first
            ``lines`` lines of the input-transform arithmetic in the target's generated
            kernels (several titles when it has several forms, e.g. source and PTX).
        tune: ``tune(shape, *, ms, reps, seed, **options)`` -> list of :class:`TileChoice`:
            the target's own tile-size choice for the square 3x3, padding-1 layer
            ``shape = (N, C, K, H)``; None: :func:`sweep_tiles` (time every ``m`` here).
        plan: ``plan(x_shape, w, padding, config)`` -> a callable of the input: the
            convolution prepared once for repeated inputs (buffers, transformed
            filters); None: ``run`` is called each time.
        resources: ``resources(m, r, shape, **options)`` -> table rows (dicts with at
            least ``target``, ``compiled`` and ``time_kind``) that the target adds to the
            portability table besides its measured run, such as what a compiler reports
            for devices absent here.
        prepare: ``prepare(w, config)`` -> keyword options of ``run`` computed from the
            caller's filter object before it is converted (a tensor's identity survives
            only there), e.g. transformed filters cached per weight.
        wisdom: True when the configurations tuned by
            :func:`~hpcnb.winograd.autotune.autotune` apply (``config="wisdom"``).
    """

    name: str
    run: Callable[..., np.ndarray]
    default_config: Callable[[int], WinogradConfig]
    available: Callable[[], bool] = _always
    requirement: str = ""
    label: str = ""
    excerpt: Callable[..., dict[str, str]] | None = None
    tune: Callable[..., list[TileChoice]] | None = None
    plan: Callable[..., Plan] | None = None
    resources: Callable[..., list[dict[str, Any]]] | None = None
    prepare: Callable[[Any, WinogradConfig], dict[str, Any]] | None = None
    wisdom: bool = False

    @property
    def title(self) -> str:
        """The label shown in tables (``label``, else ``name``)."""
        return self.label or self.name

    def make_plan(
        self, x_shape: tuple[int, ...], w: np.ndarray, padding: int, config: WinogradConfig
    ) -> Plan:
        """The convolution of inputs of ``x_shape`` with the filters ``w``, prepared once.

        Args:
            x_shape: Input shape ``(N, C, H, W)``.
            w: Filters ``(K, C, r, r)``.
            padding: Zero padding on every side.
            config: A complete configuration.

        Returns:
            A callable of a float32 input array of ``x_shape``.

        Raises:
            BackendUnavailableError: The target cannot run here.
        """
        self.require()
        check_conv_args(tuple(x_shape), tuple(w.shape), padding)
        validate_mr(config.m, int(w.shape[2]))
        if self.plan is not None:
            return self.plan(tuple(x_shape), w, padding, config)
        run, wc = self.run, np.ascontiguousarray(w)
        return lambda x: run(np.ascontiguousarray(x, np.float32), wc, padding, config)

    def tile_choices(
        self,
        shape: tuple[int, int, int, int],
        *,
        ms: Sequence[int] = (2, 4, 6),
        reps: int = 3,
        seed: int = 0,
        **options: Any,
    ) -> list[TileChoice]:
        """The target's tile-size choice for one layer (its ``tune``, else :func:`sweep_tiles`).

        Args:
            shape: ``(N, C, K, H)`` of a square 3x3 layer with padding 1.
            ms: Tile sizes to consider.
            reps: Timed rounds where the target measures.
            seed: Seed of the data.
            **options: Target-specific options of its ``tune``.

        Returns:
            One choice per device or architecture the target reports on.

        Raises:
            BackendUnavailableError: The target can neither run nor model here.
        """
        if self.tune is not None:
            return self.tune(shape, ms=tuple(ms), reps=reps, seed=seed, **options)
        return [sweep_tiles(self, shape, ms=ms, reps=reps, seed=seed)]

    def excerpts(self, m: int, r: int, lines: int = 4, **options: Any) -> dict[str, str]:
        """The target's generated kernel text to show (``{}`` without an ``excerpt``).

        Args:
            m: Outputs per tile.
            r: Filter size.
            lines: Lines per excerpt.
            **options: Target-specific options of its ``excerpt``.
        """
        return {} if self.excerpt is None else self.excerpt(m, r, lines, **options)

    def require(self) -> None:
        """Raise :class:`BackendUnavailableError` when the target cannot run here."""
        if not self.available():
            raise BackendUnavailableError(
                f"Winograd target {self.name!r} is not available here: {self.requirement}"
            )


def _check_backend(obj: object) -> str | None:
    if isinstance(obj, Backend) and obj.name:
        return None
    return f"expected a named hpcnb.winograd.backend.Backend, got {type(obj).__name__}"


TARGETS: Registry[Backend] = Registry("Winograd target", check=_check_backend)
"""The registered targets (the built-in ones register when :mod:`hpcnb.winograd` is imported)."""


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Add ``backend`` to the registry of targets under its name.

    Args:
        backend: The target.
        replace: Replace a registered target of the same name (refused otherwise).

    Returns:
        ``backend``, so a module can write ``BACKEND = register_backend(Backend(...))``.

    Raises:
        PluginError: ``backend`` is not a named :class:`Backend`, or its name is taken and
            ``replace`` is not set (a ``ValueError``).
    """
    problem = _check_backend(backend)
    name = backend.name if problem is None else repr(backend)
    return TARGETS.register(name, backend, replace=replace)


def backend_names() -> list[str]:
    """Names of the registered targets, sorted."""
    return TARGETS.names()


def get_backend(target: str | Backend) -> Backend:
    """Return the target: a registered name, a ``"package.module:attr"`` reference, or itself.

    Args:
        target: A registered name, a reference to a :class:`Backend` (``"pkg.mod:attr"``),
            ``"pkg.mod:"`` for a module that registers one when imported, or a Backend.

    Raises:
        PluginError: Unknown name (the message lists the registered ones), or a
            reference that does not resolve to a Backend (a ``ValueError``).
    """
    if isinstance(target, Backend):
        return target
    return TARGETS.get(target)


def backends(targets: Iterable[str | Backend] | None = None) -> list[Backend]:
    """The registered targets sorted by name, or the given ones resolved by :func:`get_backend`.

    Args:
        targets: Names, references or Backends; None: every registered target.
    """
    if targets is None:
        return [backend for _, backend in TARGETS.items()]
    return [get_backend(t) for t in targets]


def check_conv_args(x_shape: tuple, w_shape: tuple, padding: int) -> tuple[int, int]:
    """Validate convolution shapes; return the output size ``(Ho, Wo)``.

    Args:
        x_shape: Input shape, expected ``(N, C, H, W)``.
        w_shape: Filter shape, expected ``(K, C, r, r)``.
        padding: Zero padding on every side (int >= 0).

    Returns:
        ``(Ho, Wo)``.

    Raises:
        WinogradError: With the offending parameter named (a ``ValueError``).
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


def _resolve_config(
    backend: Backend,
    config: WinogradConfig | str | None,
    shapes: tuple[tuple[int, ...], tuple[int, ...], int],
    m: int | None,
    wisdom: str | os.PathLike | None,
) -> WinogradConfig:
    """The complete configuration of one call: given, tuned (``"wisdom"``) or default."""
    if wisdom is not None and config != "wisdom":
        raise WinogradError(
            "conv2d_winograd: wisdom= names the file read by config='wisdom'; "
            f"pass config='wisdom' to use it (config is {config!r})"
        )
    r = int(shapes[1][2])
    if m is not None:
        validate_mr(m, r)
    if config == "wisdom":
        if not backend.wisdom:
            raise WinogradError(
                f"conv2d_winograd: target {backend.name!r} keeps no tuned configurations "
                "(config='wisdom' is for the targets autotune() tunes)"
            )
        config = lookup_wisdom(*shapes, path=wisdom)
    elif config is not None and not isinstance(config, WinogradConfig):
        raise WinogradError(
            f"{backend.name}: config must be a WinogradConfig, 'wisdom' or None, got {config!r}"
        )
    cfg = config or backend.default_config(r)
    if m is not None:
        cfg = replace(cfg, m=m)
    validate_mr(cfg.m, r)
    return cfg


def conv2d_winograd(
    x: Any,
    w: Any,
    padding: int = 0,
    config: WinogradConfig | str | None = None,
    *,
    target: str | Backend = "cpu",
    m: int | None = None,
    wisdom: str | os.PathLike | None = None,
    fallback: bool = False,
    **options: Any,
) -> Any:
    """Stride-1 2-D convolution by Winograd's minimal filtering on any target, like ``F.conv2d``.

    The configuration is explicit: the target's default configuration unless ``config``
    says otherwise. On the ``"cpu"`` target the filter transform is done once per weight
    (:func:`~hpcnb.winograd.conv.cached_filters`: a ``torch.Tensor`` until it is changed
    in place, a read-only NumPy array), and the per-machine wisdom
    (:mod:`~hpcnb.winograd.wisdom`) is read only when asked with ``config="wisdom"``.
    With ``fallback=True`` (``"cpu"`` target) each layer shape runs by Winograd only where
    that was measured faster than ``torch.nn.functional.conv2d``, and by torch otherwise
    (:mod:`~hpcnb.winograd.dispatch`: the tuner's measurement of torch when ``config``
    is ``"wisdom"``, else a short measurement on the first call of a shape).

    Args:
        x: Input ``(N, C, H, W)``, a ``torch.Tensor`` or NumPy array (computed in float32).
        w: Filters ``(K, C, r, r)``.
        padding: Zero padding on every side.
        config: A :class:`~hpcnb.winograd.config.WinogradConfig`; ``None``: the target's
            default configuration; ``"wisdom"``: the configuration tuned for this machine
            and shape (:func:`~hpcnb.winograd.wisdom.lookup_wisdom`), else the default.
        target: A registered name (:func:`backend_names`), a :class:`Backend`, or a
            ``"package.module:attr"`` reference to one (``"package.module:"``: a module
            that registers one when imported).
        m: Outputs per tile side; overrides the configuration's ``m``.
        wisdom: Wisdom file read with ``config="wisdom"`` (default: see
            :func:`~hpcnb.winograd.wisdom.wisdom_path`).
        fallback: Choose per layer shape between this configuration and torch's own
            convolution (``"cpu"`` target only).
        **options: Target-specific options passed to its ``run`` (``threads_per_block``
            on ``"cuda"``, ``device`` on ``"opencl"``).

    Returns:
        Output ``(N, K, Ho, Wo)`` float32, a tensor when ``x`` is one, else an array.

    Raises:
        WinogradError: Invalid shapes, padding, m or config, a ``wisdom`` file without
            ``config="wisdom"``, or ``fallback`` on a target other than ``"cpu"`` (a
            ``ValueError``).
        PluginError: An unknown target (a ``ValueError``).
        BackendUnavailableError: The target cannot run here (a ``RuntimeError``).
    """
    backend = get_backend(target)
    shapes = (tuple(np.shape(x)), tuple(np.shape(w)), padding)
    check_conv_args(*shapes)
    cfg = _resolve_config(backend, config, shapes, m, wisdom)
    backend.require()
    if fallback:
        choice = _fallback_choice(backend, shapes, cfg, config, wisdom)
        if choice.path == "torch":
            from hpcnb.winograd.dispatch import torch_conv2d

            return torch_conv2d(x, w, padding)
        cfg = choice.config
    xa, wa = _as_array(x, np.float32), _as_array(w)
    if backend.prepare is not None:
        options = {**backend.prepare(w, cfg), **options}
    return _like(x, backend.run(xa, wa, padding, cfg, **options))


def _like(x: Any, out: np.ndarray) -> Any:
    """``out`` as a tensor when ``x`` is one, else the array."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.from_numpy(out)
    return out


def _fallback_choice(
    backend: Backend,
    shapes: tuple[tuple[int, ...], tuple[int, ...], int],
    cfg: WinogradConfig,
    config: WinogradConfig | str | None,
    wisdom: str | os.PathLike | None,
) -> Any:
    """The layer's :class:`~hpcnb.winograd.dispatch.PathChoice`: kept, from wisdom, or measured."""
    import hpcnb.winograd.dispatch as dispatch

    if backend.name != "cpu":
        raise WinogradError(
            f"conv2d_winograd: fallback=True compares with torch's CPU convolution, "
            f"so it needs target='cpu' (got {backend.name!r})"
        )
    import numba

    threads = cfg.threads or numba.get_num_threads()
    choice = dispatch.known_choice(*shapes, threads)
    if choice is None and config == "wisdom":
        choice = dispatch.wisdom_choice(*shapes, threads, wisdom)
    if choice is None or choice.config != cfg:
        x_shape, w_shape, padding = shapes
        rng = np.random.default_rng(0)
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        plan = backend.make_plan(x_shape, w, padding, cfg)  # filters transformed once
        choice = dispatch.measure_choice(
            *shapes,
            cfg,
            threads,
            winograd=lambda: plan(x),
            torch=lambda: dispatch.torch_conv2d(x, w, padding),
        )
    return choice


def _bound(plan: Plan, x: np.ndarray) -> Callable[[], np.ndarray]:
    """``plan(x)`` as a call without arguments (for the timing functions)."""
    return lambda: plan(x)


def sweep_tiles(
    backend: Backend,
    shape: tuple[int, int, int, int],
    *,
    ms: Sequence[int] = (2, 4, 6),
    reps: int = 3,
    seed: int = 0,
) -> TileChoice:
    """Time the target's default configuration at every tile size on one layer, here.

    Every ``m`` is prepared once (:meth:`Backend.make_plan`) and timed in ``reps``
    interleaved rounds after a warm-up round, on the same random data.

    Args:
        backend: The target.
        shape: ``(N, C, K, H)`` of a square 3x3 layer with padding 1.
        ms: Tile sizes to try.
        reps: Timed rounds (median).
        seed: Seed of the data.

    Returns:
        The measured choice (the fastest median).

    Raises:
        BackendUnavailableError: The target cannot run here.
    """
    backend.require()
    N, C, K, H = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, H), dtype=np.float32)
    w = rng.standard_normal((K, C, 3, 3), dtype=np.float32)
    base = backend.default_config(3)
    plans = {m: backend.make_plan(x.shape, w, 1, replace(base, m=m)) for m in ms}
    timings = interleaved({m: _bound(p, x) for m, p in plans.items()}, repeats=reps, warmup=1)
    seconds = {m: t.median for m, t in timings.items()}
    return TileChoice(backend.title, min(seconds, key=seconds.__getitem__), seconds, True)


def target_options(
    options: Mapping[str, Mapping[str, Any]] | None, backend: Backend
) -> dict[str, Any]:
    """The keyword options meant for ``backend`` in a per-target mapping (``{}`` if none).

    Args:
        options: ``{target name: {option: value}}``, or None.
        backend: The target.
    """
    return dict((options or {}).get(backend.name, {}))
