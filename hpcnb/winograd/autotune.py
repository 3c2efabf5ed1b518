"""Auto-tuning of Winograd convolutions with a JSON wisdom file.

For one layer shape the tuner times every configuration of a search space (tile size
``m``, tile blocking, loop order, thread count, GEMM back end) on random data, then times
the few fastest again together with the default configuration (interleaved rounds, more
repetitions), keeps the fastest of that final measurement, and stores the measurements in
a *wisdom* file keyed by machine and shape, like FFTW's wisdom. The default configuration
is always a finalist, so the tuner never picks a configuration it measured as slower than
the default. :func:`~hpcnb.winograd.conv.conv2d_winograd` with ``m=None`` reads it.

The wisdom file lives in the user cache folder (``~/.cache/hpcnb/winograd_wisdom.json``),
never in the repository; ``$HPCNB_WISDOM`` or the ``path`` argument override it.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numba
import numpy as np

from hpcnb.winograd.codegen import cache_dir
from hpcnb.winograd.conv import (
    WinogradConfig,
    check_conv_args,
    default_config,
    filter_transform,
    winograd_numpy,
)

__all__ = [
    "TuneResult",
    "autotune",
    "lookup",
    "machine_key",
    "search_space",
    "shape_key",
    "time_call",
    "time_interleaved",
    "time_rounds",
    "wisdom_path",
]

_FORMAT = 1


def wisdom_path(path: str | os.PathLike | None = None) -> Path:
    """Return the wisdom file: ``path``, else ``$HPCNB_WISDOM``, else the user cache folder."""
    if path is not None:
        return Path(path)
    env = os.environ.get("HPCNB_WISDOM")
    if env:
        return Path(env)
    return cache_dir() / "winograd_wisdom.json"


def machine_key() -> str:
    """Identify the machine: CPU model, logical CPUs, Numba threads, architecture."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}|cpus={os.cpu_count()}|numba_threads={numba.config.NUMBA_NUM_THREADS}"


def shape_key(x_shape: tuple, w_shape: tuple, padding: int) -> str:
    """Key of a layer: ``N{N}_C{C}_H{H}_W{W}_K{K}_r{r}_p{padding}``."""
    N, C, H, W = (int(v) for v in x_shape)
    K, _, r, _ = (int(v) for v in w_shape)
    return f"N{N}_C{C}_H{H}_W{W}_K{K}_r{r}_p{int(padding)}"


def _load(path: Path) -> dict:
    if not path.exists():
        return {"format": _FORMAT, "machines": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"wisdom file {path}: not valid JSON (line {exc.lineno}): {exc.msg}"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != _FORMAT or "machines" not in data:
        raise ValueError(
            f"wisdom file {path}: expected {{'format': {_FORMAT}, 'machines': {{...}}}}"
        )
    return data


def lookup(
    x_shape: tuple, w_shape: tuple, padding: int, path: str | os.PathLike | None = None
) -> WinogradConfig | None:
    """Return the tuned configuration for this machine and shape, or None.

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        path: Wisdom file (default :func:`wisdom_path`).

    Returns:
        The stored best configuration, or None when the shape was not tuned here.
    """
    data = _load(wisdom_path(path))
    entry = data["machines"].get(machine_key(), {}).get(shape_key(x_shape, w_shape, padding))
    if entry is None:
        return None
    return WinogradConfig(**entry["best"])


@dataclass(frozen=True)
class TuneResult:
    """Outcome of one tuning run.

    Attributes:
        shape: The shape key.
        best: Fastest configuration in the final measurement.
        best_s: Its median time in the final measurement (s).
        default_s: Median time of the default configuration in the final measurement (s).
        trials: ``(config as dict, median seconds)`` for every configuration of the sweep.
        final: ``(config as dict, median seconds)`` for the finalists (the default first),
            timed again in interleaved rounds; ``best`` is the fastest of these.
        from_wisdom: True when the result was read back instead of measured.
    """

    shape: str
    best: WinogradConfig
    best_s: float
    default_s: float
    trials: tuple[tuple[dict, float], ...] = field(default_factory=tuple)
    final: tuple[tuple[dict, float], ...] = field(default_factory=tuple)
    from_wisdom: bool = False

    @property
    def gain(self) -> float:
        """Default time over tuned time."""
        return self.default_s / self.best_s


def search_space(
    r: int,
    ms: tuple[int, ...] = (2, 3, 4, 6),
    blocks: tuple[int, ...] = (0, 64, 512),
    orders: tuple[bool, ...] = (True, False),
    threads: tuple[int, ...] = (1, 2),
    gemms: tuple[str, ...] = ("blas",),
) -> list[WinogradConfig]:
    """Cartesian product of the tuning knobs (plus the default configuration)."""
    space = [
        WinogradConfig(m=m, block_tiles=b, channel_major=o, threads=t, gemm=g)
        for m, b, o, t, g in itertools.product(ms, blocks, orders, threads, gemms)
    ]
    d = default_config(r)
    return space if d in space else [d, *space]


def time_call(fn, reps: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_rounds(fns: list, reps: int = 5, warmup: int = 1) -> list[tuple[float, ...]]:
    """Wall times of several callables, every round of an interleaved measurement kept.

    Each round calls every function once, in order, so that changes in machine load
    affect all of them alike; ``warmup`` untimed rounds come first. Round ``i`` of one
    callable and round ``i`` of another ran back to back, so their ratio is a per-round
    sample robust to slow drifts of load (pass such ratios as ``samples`` to
    :func:`hpcnb.records.record`).

    Args:
        fns: Callables without arguments.
        reps: Timed rounds.
        warmup: Untimed rounds before.

    Returns:
        Per callable, in order, its ``reps`` durations in seconds (round order).

    Raises:
        ValueError: ``reps`` < 1 or ``warmup`` < 0.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"time_rounds: reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, acc in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return [tuple(t) for t in times]


def time_interleaved(fns: list, reps: int = 5, warmup: int = 1) -> list[float]:
    """Median wall times of several callables timed in interleaved rounds.

    Each round calls every function once, in order, so that changes in machine load
    affect all of them alike; ``warmup`` untimed rounds come first (:func:`time_rounds`).

    Args:
        fns: Callables without arguments.
        reps: Timed rounds (median).
        warmup: Untimed rounds before.

    Returns:
        Median seconds per callable, in order.

    Raises:
        ValueError: ``reps`` < 1 or ``warmup`` < 0.
    """
    return [float(np.median(t)) for t in time_rounds(fns, reps=reps, warmup=warmup)]


def autotune(
    x_shape: tuple,
    w_shape: tuple,
    padding: int = 1,
    *,
    space: list[WinogradConfig] | None = None,
    knobs: dict[str, tuple] | None = None,
    rounds: int = 1,
    reps: int = 3,
    finalists: int = 3,
    final_reps: int = 5,
    seed: int = 0,
    path: str | os.PathLike | None = None,
    reuse: bool = True,
    default: WinogradConfig | None = None,
    progress: bool | None = False,
) -> TuneResult:
    """Time every configuration on random data, keep the fastest, store it as wisdom.

    Filters are transformed once per tile size before timing (inference with fixed
    weights), so the times compare the per-input work of each configuration. The sweep's
    single measurements are noisy (and their minimum is biased towards a lucky one), so
    the ``finalists`` fastest configurations of the sweep and the default configuration
    are timed again in ``final_reps`` interleaved rounds after a warm-up round; the best
    configuration is the fastest median of that final measurement, ties going to the
    default. So the tuner never picks a configuration it measured as slower than default.

    Args:
        x_shape: Input shape ``(N, C, H, W)``.
        w_shape: Filter shape ``(K, C, r, r)``.
        padding: Zero padding.
        space: Configurations to try exhaustively (default :func:`search_space`).
        knobs: Instead of ``space``, a coordinate search: ``{"m": (2, 4, 6),
            "block_tiles": (0, 256), ...}`` varies one knob at a time from the default,
            keeping each improvement (far fewer measurements than the full product).
        rounds: Passes of the coordinate search.
        reps: Timed repetitions per configuration in the sweep (median).
        finalists: Fastest configurations of the sweep that are timed again (>= 1).
        final_reps: Interleaved rounds of the final measurement (>= 1).
        seed: Seed of the random data.
        path: Wisdom file.
        reuse: Return the stored result when this machine and shape were tuned before.
        default: The untuned reference configuration (default :func:`default_config`).
        progress: ``False``: silent; ``True``: a live bar; ``None``: live only in
            interactive use, one summary line in batch runs (see
            :func:`hpcnb.progress.show_progress`).

    Returns:
        The tuning result (``from_wisdom`` tells whether it was measured now).
    """
    check_conv_args(tuple(x_shape), tuple(w_shape), padding)
    if finalists < 1 or final_reps < 1:
        raise ValueError(
            f"autotune: finalists and final_reps must be >= 1, got {finalists}, {final_reps}"
        )
    r = int(w_shape[2])
    wp = wisdom_path(path)
    key = shape_key(x_shape, w_shape, padding)
    data = _load(wp)
    stored = data["machines"].get(machine_key(), {}).get(key)
    if reuse and stored is not None:
        return TuneResult(
            shape=key,
            best=WinogradConfig(**stored["best"]),
            best_s=stored["best_s"],
            default_s=stored["default_s"],
            trials=tuple((t["config"], t["seconds"]) for t in stored["trials"]),
            final=tuple((t["config"], t["seconds"]) for t in stored.get("final", ())),
            from_wisdom=True,
        )
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    default = default or default_config(r)
    filters: dict[tuple, np.ndarray] = {}  # filters are transformed once per (m, points)
    measured: dict[WinogradConfig, float] = {}

    def runner(cfg: WinogradConfig):
        key_u = (cfg.m, cfg.points)
        if key_u not in filters:
            filters[key_u] = filter_transform(w, cfg.m, cfg.points, dtype=np.float32)
        U = filters[key_u]
        return lambda: winograd_numpy(x, w, padding, cfg, U=U)

    def measure(cfg: WinogradConfig) -> float:
        if cfg not in measured:
            measured[cfg] = time_call(runner(cfg), reps=reps)
        return measured[cfg]

    measure(default)
    if knobs is not None:  # coordinate search: one knob at a time, the others at their best
        unknown = set(knobs) - {"m", "block_tiles", "channel_major", "threads", "gemm"}
        if unknown:
            raise ValueError(f"autotune: unknown knobs {sorted(unknown)}")
        best = default
        for _ in range(rounds):
            for knob, values in knobs.items():
                for v in values:
                    cand = replace(best, **{knob: v})
                    if measure(cand) < measure(best):
                        best = cand
    else:
        space = list(space or search_space(r))
        from hpcnb.progress import progress as progress_bar

        iterator = space
        if progress is not False:
            iterator = progress_bar(space, desc=f"autotune {key}", unit="configs", enabled=progress)
        for cfg in iterator:
            measure(cfg)
    trials = [(asdict(c), t) for c, t in measured.items()]
    # final measurement: the default and the fastest few of the sweep, interleaved
    ranked = [c for c, _ in sorted(measured.items(), key=lambda kv: kv[1]) if c != default]
    finals = [default, *ranked[:finalists]]
    final_s = time_interleaved([runner(c) for c in finals], reps=final_reps, warmup=1)
    i_best = min(range(len(finals)), key=lambda i: (final_s[i], i))  # ties: the default
    best, best_s, default_s = finals[i_best], final_s[i_best], final_s[0]
    final = [(asdict(c), t) for c, t in zip(finals, final_s, strict=True)]
    result = TuneResult(key, best, best_s, default_s, tuple(trials), tuple(final))
    data = _load(wp)  # re-read: another process may have written meanwhile
    data["machines"].setdefault(machine_key(), {})[key] = {
        "best": asdict(best),
        "best_s": best_s,
        "default_s": default_s,
        "trials": [{"config": c, "seconds": s} for c, s in trials],
        "final": [{"config": c, "seconds": s} for c, s in final],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    wp.parent.mkdir(parents=True, exist_ok=True)
    tmp = wp.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, wp)
    return result
