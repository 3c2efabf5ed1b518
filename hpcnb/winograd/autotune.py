"""Auto-tuning of Winograd convolutions with a JSON wisdom file.

For one layer shape the tuner times every configuration of a search space (tile size
``m``, tile blocking, loop order, thread count, GEMM back end) on random data, then times
the few fastest again together with the default configuration (interleaved rounds, more
repetitions), keeps the fastest of that final measurement, and stores the measurements in
a *wisdom* file keyed by machine and shape, like FFTW's wisdom. The default configuration
is always a finalist, so the tuner never picks a configuration it measured as slower than
the default. :func:`~hpcnb.winograd.conv.conv2d_winograd` with ``m=None`` reads it.

The wisdom file lives under the hpcnb cache root (:func:`hpcnb.paths.cache_root`, e.g.
``~/.cache/hpcnb/winograd_wisdom.json``), never in the repository; ``$HPCNB_WISDOM`` or the
``path`` argument override it.

The file is a cache, so a broken one never stops a computation: :func:`read_wisdom`
validates it (the schema below, finite positive times, no unknown fields, at most
:data:`MAX_WISDOM_BYTES` = 16 MiB or ``$HPCNB_WISDOM_MAX_BYTES``) and ignores a file that
does not validate with a :class:`WisdomWarning` naming the file and the first problem;
the next :func:`autotune` replaces it. :func:`write_wisdom` writes atomically (a
temporary file, then ``os.replace``), so a concurrent reader sees the old or the new
file, never half of one; of two processes tuning at once, the later write wins.

Schema (format 1)::

    {"format": 1,
     "machines": {"<machine key>": {"<shape key>": {
         "best": <config>, "best_s": <s>, "default_s": <s>,
         "trials": [{"config": <config>, "seconds": <s>}, ...],
         "final": [{"config": <config>, "seconds": <s>}, ...],   # optional
         "measured_at": "<ISO 8601 time>"}}}}                    # optional

where the shape key is :func:`shape_key`'s, ``<config>`` holds fields of
:class:`~hpcnb.winograd.conv.WinogradConfig` (with an ``m`` valid for the key's ``r``) and
``<s>`` is a finite number of seconds > 0.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import re
import time
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numba
import numpy as np

from hpcnb.codecache import atomic_write
from hpcnb.winograd.codegen import cache_dir
from hpcnb.winograd.conv import (
    WinogradConfig,
    check_conv_args,
    default_config,
    filter_transform,
    winograd_numpy,
)
from hpcnb.winograd.transforms import POINT_SETS, validate_mr

__all__ = [
    "MAX_WISDOM_BYTES",
    "TuneResult",
    "WisdomWarning",
    "autotune",
    "lookup",
    "machine_key",
    "read_wisdom",
    "search_space",
    "shape_key",
    "time_call",
    "time_interleaved",
    "time_rounds",
    "wisdom_path",
    "write_wisdom",
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


MAX_WISDOM_BYTES = 16 * 2**20
"""Default largest wisdom file read (bytes); a larger one is ignored with a warning.

A tuned shape takes a few kilobytes, so 16 MiB holds thousands of them. Override it for
the process with ``$HPCNB_WISDOM_MAX_BYTES`` or per call with ``read_wisdom(max_bytes=...)``.
"""


def _max_bytes() -> int:
    value = os.environ.get("HPCNB_WISDOM_MAX_BYTES")
    if value:
        try:
            limit = int(value)
            if limit > 0:
                return limit
        except ValueError:
            pass
        warnings.warn(
            f"$HPCNB_WISDOM_MAX_BYTES={value[:40]!r} is not a positive integer: "
            f"using {MAX_WISDOM_BYTES}",
            WisdomWarning,
            stacklevel=3,
        )
    return MAX_WISDOM_BYTES


class WisdomWarning(UserWarning):
    """A wisdom file was ignored (it does not validate) or could not be written."""


class _WisdomError(Exception):
    """Internal: the wisdom file does not validate; the message says where and why."""


def _empty() -> dict:
    return {"format": _FORMAT, "machines": {}}


def _reject_constant(name: str) -> float:
    raise _WisdomError(f"non-finite number {name} (JSON allows finite numbers only)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _WisdomError(f"number {text[:40]} is out of range (not finite as a float)")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _WisdomError(f"duplicate key {k[:80]!r}")
        out[k] = v
    return out


def _where(path: str, key: str) -> str:
    return f"{path}[{key[:80]!r}]"


def _check_keys(obj: object, path: str, required: set[str], optional: set[str]) -> dict:
    if not isinstance(obj, dict):
        raise _WisdomError(f"{path}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise _WisdomError(f"{path}: unknown field {unknown[0][:80]!r}")
    missing = sorted(required - set(obj))
    if missing:
        raise _WisdomError(f"{path}: missing field {missing[0]!r}")
    return obj


def _check_seconds(value: object, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WisdomError(f"{path}: expected a number of seconds, got {type(value).__name__}")
    try:
        ok = math.isfinite(value) and value > 0
    except OverflowError:  # an integer beyond the float range
        ok = False
    if not ok:
        raise _WisdomError(f"{path}: expected a finite number of seconds > 0, got {value!r:.40}")


_CONFIG_TYPES = {
    f.name: {"int": int, "bool": bool, "str": str}[getattr(f.type, "__name__", f.type)]
    for f in fields(WinogradConfig)
}


def _check_config(obj: object, path: str, r: int) -> None:
    cfg = _check_keys(obj, path, set(), set(_CONFIG_TYPES))
    for k, v in cfg.items():
        want = _CONFIG_TYPES[k]
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            got = type(v).__name__
            raise _WisdomError(f"{_where(path, k)}: expected {want.__name__}, got {got}")
    if cfg.get("points", "default") not in POINT_SETS:
        raise _WisdomError(f"{_where(path, 'points')}: expected one of {POINT_SETS}")
    try:
        validate_mr(WinogradConfig(**cfg).m, r)
    except (ValueError, TypeError) as exc:
        raise _WisdomError(f"{path}: {exc}") from None


def _check_timings(obj: object, path: str, r: int) -> None:
    if not isinstance(obj, list):
        raise _WisdomError(f"{path}: expected a list, got {type(obj).__name__}")
    for i, t in enumerate(obj):
        item = _check_keys(t, f"{path}[{i}]", {"config", "seconds"}, set())
        _check_config(item["config"], f"{path}[{i}]['config']", r)
        _check_seconds(item["seconds"], f"{path}[{i}]['seconds']")


_SHAPE_KEY = re.compile(
    r"N[0-9]{1,9}_C[0-9]{1,9}_H[0-9]{1,9}_W[0-9]{1,9}_K[0-9]{1,9}_r([0-9]{1,2})_p[0-9]{1,9}"
)


def _validate(data: object) -> dict:
    top = _check_keys(data, "top level", {"format", "machines"}, set())
    if top["format"] != _FORMAT or isinstance(top["format"], bool):
        raise _WisdomError(f"format {top['format']!r:.40}: this version reads format {_FORMAT}")
    machines = top["machines"]
    if not isinstance(machines, dict):
        raise _WisdomError(f"'machines': expected an object, got {type(machines).__name__}")
    for mk, shapes in machines.items():
        mpath = _where("machines", mk)
        if not isinstance(shapes, dict):
            raise _WisdomError(f"{mpath}: expected an object, got {type(shapes).__name__}")
        for sk, entry in shapes.items():
            epath = _where(mpath, sk)
            match = _SHAPE_KEY.fullmatch(sk)
            if match is None:
                raise _WisdomError(f"{epath}: not a shape key like 'N1_C64_H56_W56_K64_r3_p1'")
            r = int(match.group(1))
            e = _check_keys(
                entry,
                epath,
                {"best", "best_s", "default_s", "trials"},
                {"final", "measured_at"},
            )
            _check_config(e["best"], _where(epath, "best"), r)
            _check_seconds(e["best_s"], _where(epath, "best_s"))
            _check_seconds(e["default_s"], _where(epath, "default_s"))
            _check_timings(e["trials"], _where(epath, "trials"), r)
            _check_timings(e.get("final", []), _where(epath, "final"), r)
            if not isinstance(e.get("measured_at", ""), str):
                raise _WisdomError(f"{_where(epath, 'measured_at')}: expected a string")
    return top


def _parse(path: Path, max_bytes: int) -> dict:
    """Read and validate ``path``; raise :class:`_WisdomError` saying what is wrong."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise _WisdomError(f"unreadable ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise _WisdomError(
            f"larger than the limit of {max_bytes} bytes (see $HPCNB_WISDOM_MAX_BYTES)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _WisdomError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise _WisdomError(f"not valid JSON ({where}): {exc.msg}") from None
    except RecursionError:
        raise _WisdomError("JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _WisdomError(f"not valid JSON: {exc}") from None
    return _validate(data)


def read_wisdom(path: str | os.PathLike | None = None, *, max_bytes: int | None = None) -> dict:
    """Return the validated content of the wisdom file, or an empty wisdom.

    A missing file is an empty wisdom. A file that does not validate (not JSON, truncated,
    unknown or missing fields, ``machines`` not an object, wrong types, non-finite or
    non-positive times, larger than ``max_bytes``, unreadable) is ignored: the result is
    an empty wisdom and a :class:`WisdomWarning` names the file and the first problem.
    This function never raises for the file's content.

    Args:
        path: Wisdom file (default :func:`wisdom_path`).
        max_bytes: Largest file read (default ``$HPCNB_WISDOM_MAX_BYTES``, else
            :data:`MAX_WISDOM_BYTES`).

    Returns:
        ``{"format": 1, "machines": {machine key: {shape key: entry}}}`` (see the module
        docstring for the schema).
    """
    wp = wisdom_path(path)
    limit = _max_bytes() if max_bytes is None else int(max_bytes)
    if not wp.exists() and not wp.is_symlink():
        return _empty()
    try:
        return _parse(wp, limit)
    except _WisdomError as exc:
        warnings.warn(
            f"wisdom file {wp}: ignored, {exc}; the next autotune() replaces it",
            WisdomWarning,
            stacklevel=2,
        )
        return _empty()


def write_wisdom(data: dict, path: str | os.PathLike | None = None) -> Path:
    """Write a wisdom (as returned by :func:`read_wisdom`) atomically.

    The JSON goes to a temporary file next to the wisdom file, which then replaces it
    (``os.replace``): a concurrent reader sees the old or the new file, never a part.

    Args:
        data: The wisdom; it must validate (the schema of the module docstring).
        path: Wisdom file (default :func:`wisdom_path`).

    Returns:
        The path written.

    Raises:
        ValueError: ``data`` does not validate (nothing is written).
        OSError: The file cannot be written.
    """
    wp = wisdom_path(path)
    try:
        _validate(data)
    except _WisdomError as exc:
        raise ValueError(f"wisdom for {wp} does not validate: {exc}") from None
    atomic_write(wp, json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return wp


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
    data = read_wisdom(path)
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
    data = read_wisdom(wp)
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
    data = read_wisdom(wp)  # re-read: another process may have written meanwhile
    data["machines"].setdefault(machine_key(), {})[key] = {
        "best": asdict(best),
        "best_s": best_s,
        "default_s": default_s,
        "trials": [{"config": c, "seconds": s} for c, s in trials],
        "final": [{"config": c, "seconds": s} for c, s in final],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        write_wisdom(data, wp)
    except (OSError, ValueError) as exc:
        warnings.warn(
            f"wisdom file {wp}: not written ({exc}); the result is returned but not stored",
            WisdomWarning,
            stacklevel=2,
        )
    return result
