"""Auto-tuning of Winograd convolutions, stored as wisdom.

For one layer shape the tuner times every configuration of a search space (tile size
``m``, tile blocking, schedule, loop order, thread count, GEMM back end) on random data, then times
the few fastest again together with the default configuration (interleaved rounds, more
repetitions, :func:`hpcnb.timing.interleaved`), keeps the fastest of that final
measurement, and stores the measurements in the wisdom file
(:mod:`~hpcnb.winograd.wisdom`) keyed by machine and shape, like FFTW's wisdom. The
default configuration is always a finalist, so the tuner never picks a configuration it
measured as slower than the default. The convolution uses the stored choice only when
asked: ``conv2d_winograd(x, w, config="wisdom")``. :func:`regret_study` measures the
tuner against the best configuration of an exhaustive sweep (regret = tuned / best - 1).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from hpcnb.timing import interleaved, median_time
from hpcnb.winograd.backend import check_conv_args
from hpcnb.winograd.config import WinogradConfig, WinogradError, default_config
from hpcnb.winograd.conv import filter_transform, winograd_numpy
from hpcnb.winograd.wisdom import read_wisdom, shape_key, store_entry, stored_entry

__all__ = ["KNOBS", "RegretResult", "TuneResult", "autotune", "regret_study", "search_space"]


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
        torch_s: Median time of ``torch.nn.functional.conv2d`` in the final measurement
            (s), None when torch was not timed.
        rejected: ``(config as dict, relative error)`` of the configurations left out for
            an error above the budget (``max_error``).
    """

    shape: str
    best: WinogradConfig
    best_s: float
    default_s: float
    trials: tuple[tuple[dict, float], ...] = field(default_factory=tuple)
    final: tuple[tuple[dict, float], ...] = field(default_factory=tuple)
    from_wisdom: bool = False
    torch_s: float | None = None
    rejected: tuple[tuple[dict, float], ...] = field(default_factory=tuple)

    @property
    def gain(self) -> float:
        """Default time over tuned time."""
        return self.default_s / self.best_s

    @property
    def torch_gain(self) -> float | None:
        """Torch time over tuned time (None when torch was not timed)."""
        return None if self.torch_s is None else self.torch_s / self.best_s


def search_space(
    r: int,
    ms: tuple[int, ...] = (2, 3, 4, 6),
    blocks: tuple[int, ...] = (0, 64, 512),
    orders: tuple[bool, ...] = (True, False),
    threads: tuple[int, ...] = (1, 2),
    gemms: tuple[str, ...] = ("blas",),
) -> list[WinogradConfig]:
    """Cartesian product of the tuning knobs (plus the default configuration).

    Args:
        r: Filter size (decides the default configuration).
        ms: Tile sizes.
        blocks: Tiles per block (``block_tiles``).
        orders: Loop orders (``channel_major``).
        threads: Thread counts.
        gemms: GEMM back ends.
    """
    space = [
        WinogradConfig(m=m, block_tiles=b, channel_major=o, threads=t, gemm=g)
        for m, b, o, t, g in itertools.product(ms, blocks, orders, threads, gemms)
    ]
    d = default_config(r)
    return space if d in space else [d, *space]


#: The fields of :class:`~hpcnb.winograd.config.WinogradConfig` a coordinate search may vary.
KNOBS: tuple[str, ...] = (
    "m",
    "block_tiles",
    "channel_major",
    "threads",
    "gemm",
    "schedule",
    "fused",
    "points",
)


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
    compare_torch: bool = True,
    max_error: float | None = None,
) -> TuneResult:
    """Time every configuration on random data, keep the fastest, store it as wisdom.

    Filters are transformed once per tile size before timing (inference with fixed
    weights), so the times compare the per-input work of each configuration. The sweep's
    single measurements are noisy (and their minimum is biased towards a lucky one), so
    the ``finalists`` fastest configurations of the sweep and the default configuration
    are timed again in ``final_reps`` interleaved rounds after a warm-up round; the best
    configuration is the fastest median of that final measurement, ties going to the
    default. So the tuner never picks a configuration it measured as slower than default.
    With ``compare_torch`` torch's own convolution runs in the same final rounds, and its
    time is stored beside the choice (``torch_s``): the evidence on which
    ``conv2d_winograd(..., config="wisdom", fallback=True)`` runs the layer by torch.
    Each final sample is the mean of two calls after an untimed one
    (:func:`hpcnb.timing.interleaved`). With ``max_error`` a configuration whose output
    on the tuning data errs by more (relative to a float64 convolution) is not timed; the
    default configuration is always kept, as the reference the choice never loses to.

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
        compare_torch: Time torch's convolution in the final measurement.
        max_error: Largest relative error a configuration may have (None: no check).

    Returns:
        The tuning result (``from_wisdom`` tells whether it was measured now).

    Raises:
        WinogradError: Invalid shapes, ``finalists`` or ``final_reps`` below 1, or an
            unknown knob (a ``ValueError``).
    """
    _check_tuning(x_shape, w_shape, padding, knobs, finalists, final_reps)
    key = shape_key(x_shape, w_shape, padding)
    stored = stored_entry(read_wisdom(path), key)
    if reuse and stored is not None:
        return _stored_result(key, stored)
    r = int(w_shape[2])
    default = default or default_config(r)
    trials = _Trials(x_shape, w_shape, padding, reps, seed, max_error, keep=default)
    trials.measure(default)
    if knobs is not None:
        _coordinate_search(trials, default, knobs, rounds)
    else:
        _sweep(trials, list(space or search_space(r)), progress, key)
    result = _final_measurement(trials, key, default, finalists, final_reps, compare_torch)
    store_entry(key, _wisdom_entry(result), path)
    return result


def _check_tuning(
    x_shape: tuple,
    w_shape: tuple,
    padding: int,
    knobs: dict[str, tuple] | None,
    finalists: int,
    final_reps: int,
) -> None:
    """Refuse a tuning run that could not run or could not choose."""
    check_conv_args(tuple(x_shape), tuple(w_shape), padding)
    if finalists < 1 or final_reps < 1:
        raise WinogradError(
            f"autotune: finalists and final_reps must be >= 1, got {finalists}, {final_reps}"
        )
    unknown = set(knobs or ()) - set(KNOBS)
    if unknown:
        raise WinogradError(f"autotune: unknown knobs {sorted(unknown)}")


def _stored_result(key: str, stored: dict) -> TuneResult:
    """The tuning result kept in the wisdom for ``key``."""
    return TuneResult(
        shape=key,
        best=WinogradConfig(**stored["best"]),
        best_s=stored["best_s"],
        default_s=stored["default_s"],
        trials=tuple((t["config"], t["seconds"]) for t in stored["trials"]),
        final=tuple((t["config"], t["seconds"]) for t in stored.get("final", ())),
        from_wisdom=True,
        torch_s=stored.get("torch_s"),
    )


class _Trials:
    """The measurements of one tuning run on one random layer: each configuration once.

    Filters are transformed once per ``(m, points)`` (inference with fixed weights), and
    every configuration is timed once (``reps`` repetitions after a warm-up call). With
    ``max_error``, a configuration whose output errs by more than that against a float64
    convolution of the same data is not timed (infinite time, kept in ``rejected``),
    except ``keep`` (the default configuration).
    """

    def __init__(
        self,
        x_shape: tuple,
        w_shape: tuple,
        padding: int,
        reps: int,
        seed: int,
        max_error: float | None = None,
        keep: WinogradConfig | None = None,
    ):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal(x_shape, dtype=np.float32)
        self.w = rng.standard_normal(w_shape, dtype=np.float32)
        self.padding, self.reps, self.max_error, self.keep = padding, reps, max_error, keep
        self.filters: dict[tuple, np.ndarray] = {}
        self.measured: dict[WinogradConfig, float] = {}
        self.rejected: dict[WinogradConfig, float] = {}
        self._reference: np.ndarray | None = None

    def error_ok(self, cfg: WinogradConfig) -> bool:
        """True when ``cfg`` is within the error budget (always without one, or for ``keep``)."""
        if self.max_error is None or cfg == self.keep:
            return True
        from hpcnb.winograd.numerics import direct_fp64, relative_error

        if self._reference is None:
            self._reference = direct_fp64(self.x, self.w, self.padding)
        err = relative_error(self.runner(cfg)(), self._reference)
        if err > self.max_error:
            self.rejected[cfg] = err
        return err <= self.max_error

    def runner(self, cfg: WinogradConfig) -> Callable[[], np.ndarray]:
        """One convolution of the layer with ``cfg``, its filters transformed beforehand."""
        key_u = (cfg.m, cfg.points)
        if key_u not in self.filters:
            self.filters[key_u] = filter_transform(self.w, cfg.m, cfg.points, dtype=np.float32)
        U = self.filters[key_u]
        x, w, padding = self.x, self.w, self.padding
        return lambda: winograd_numpy(x, w, padding, cfg, U=U)

    def measure(self, cfg: WinogradConfig) -> float:
        """Median seconds of ``cfg`` (timed on its first request only)."""
        if cfg in self.rejected:
            return float("inf")
        if cfg not in self.measured:
            if not self.error_ok(cfg):
                return float("inf")
            self.measured[cfg] = median_time(self.runner(cfg), repeats=self.reps, warmup=1).median
        return self.measured[cfg]


def _coordinate_search(
    trials: _Trials, default: WinogradConfig, knobs: dict[str, tuple], rounds: int
) -> None:
    """One knob at a time from the default, the others at their best so far."""
    best = default
    for _ in range(rounds):
        for knob, values in knobs.items():
            for v in values:
                cand = replace(best, **{knob: v})
                if trials.measure(cand) < trials.measure(best):
                    best = cand


def _sweep(trials: _Trials, space: list[WinogradConfig], progress: bool | None, key: str) -> None:
    """Every configuration of ``space`` once, with a progress bar when asked."""
    from hpcnb.progress import progress as progress_bar

    iterator: Iterable[WinogradConfig] = space
    if progress is not False:
        iterator = progress_bar(space, desc=f"autotune {key}", unit="configs", enabled=progress)
    for cfg in iterator:
        trials.measure(cfg)


def _final_measurement(
    trials: _Trials,
    key: str,
    default: WinogradConfig,
    finalists: int,
    final_reps: int,
    compare_torch: bool = False,
) -> TuneResult:
    """The default, the fastest few of the sweep (and torch) timed again, interleaved."""
    measured = trials.measured
    ranked = [c for c, _ in sorted(measured.items(), key=lambda kv: kv[1]) if c != default]
    finals = [default, *ranked[:finalists]]
    fns: list[Callable[[], object]] = [trials.runner(c) for c in finals]
    if compare_torch:
        from hpcnb.winograd.dispatch import torch_conv2d

        x, w, padding = trials.x, trials.w, trials.padding
        fns.append(lambda: torch_conv2d(x, w, padding))
    timings = interleaved(fns, repeats=final_reps, warmup=1, calls=2, lead=1)
    final_s = [t.median for t in timings[: len(finals)]]
    i_best = min(range(len(finals)), key=lambda i: (final_s[i], i))  # ties: the default
    trial_rows = tuple((asdict(c), t) for c, t in measured.items())
    final = tuple((asdict(c), t) for c, t in zip(finals, final_s, strict=True))
    return TuneResult(
        key,
        finals[i_best],
        final_s[i_best],
        final_s[0],
        trial_rows,
        final,
        torch_s=timings[-1].median if compare_torch else None,
        rejected=tuple((asdict(c), e) for c, e in trials.rejected.items()),
    )


def _wisdom_entry(result: TuneResult) -> dict:
    """The wisdom entry (schema of :mod:`~hpcnb.winograd.wisdom`) of a measured result."""
    entry = {
        "best": asdict(result.best),
        "best_s": result.best_s,
        "default_s": result.default_s,
        "trials": [{"config": c, "seconds": s} for c, s in result.trials],
        "final": [{"config": c, "seconds": s} for c, s in result.final],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if result.torch_s is not None:
        entry["torch_s"] = result.torch_s
    return entry


@dataclass(frozen=True)
class RegretResult:
    """The tuner's choice against the best configuration of an exhaustive sweep.

    Attributes:
        shape: The shape key.
        tuned: The tuner's choice.
        best: The fastest configuration of the sweep (median over its rounds).
        regret: ``tuned time / best time - 1`` (medians of the same interleaved rounds).
        round_regrets: Per round ``i``: tuned time / the fastest time of any configuration in
            round ``i`` - 1 (never negative; noise can only make it larger).
        tune_s: Wall seconds the tuner took (its sweep, finalists and wisdom write).
        sweep_s: Wall seconds of the exhaustive sweep.
        configs: Configurations in the sweep.
        measured: Timed configurations of the tuner (its cost in measurements).
    """

    shape: str
    tuned: WinogradConfig
    best: WinogradConfig
    regret: float
    round_regrets: tuple[float, ...]
    tune_s: float
    sweep_s: float
    configs: int
    measured: int


def regret_study(
    x_shape: tuple,
    w_shape: tuple,
    padding: int,
    *,
    space: list[WinogradConfig],
    knobs: dict[str, tuple],
    reps: int = 3,
    tune_reps: int = 1,
    seed: int = 0,
    path: str | os.PathLike | None = None,
    max_error: float | None = None,
) -> RegretResult:
    """Tune one shape by coordinate search, then time the whole space to find its best.

    The tuner runs as a user would run it (``reuse=False``, its result stored in the
    wisdom at ``path``). Then every configuration of ``space`` and the tuner's choice are
    timed together in ``reps`` interleaved rounds after a warm-up round, on the same data;
    the regret compares the tuner's choice with the fastest median of that sweep.

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        space: The exhaustive space (the ground truth).
        knobs: The tuner's coordinate search (see :func:`autotune`).
        reps: Interleaved rounds of the exhaustive sweep.
        tune_reps: The tuner's repetitions per configuration.
        seed: Seed of the data.
        path: Wisdom file.
        max_error: The tuner's error budget (see :func:`autotune`).

    Returns:
        The comparison.
    """
    t0 = time.perf_counter()
    res = autotune(
        x_shape,
        w_shape,
        padding,
        knobs=knobs,
        reps=tune_reps,
        seed=seed,
        path=path,
        reuse=False,
        max_error=max_error,
    )
    tune_s = time.perf_counter() - t0
    configs = list(dict.fromkeys([*space, res.best]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    filters = {
        (c.m, c.points): filter_transform(w, c.m, c.points, dtype=np.float32) for c in configs
    }

    def runner(c: WinogradConfig) -> Callable[[], np.ndarray]:
        U = filters[(c.m, c.points)]
        return lambda: winograd_numpy(x, w, padding, c, U=U)

    t0 = time.perf_counter()
    timings = interleaved([runner(c) for c in configs], repeats=reps, warmup=1)
    sweep_s = time.perf_counter() - t0
    medians = [t.median for t in timings]
    i_best = int(np.argmin(medians))
    i_tuned = configs.index(res.best)
    # per round against the fastest configuration of that round: >= 0 by construction and,
    # under noise, biased towards a larger regret (the minimum of many noisy times is low)
    fastest = np.min([t.samples for t in timings], axis=0)
    per_round = tuple(
        float(a / b - 1) for a, b in zip(timings[i_tuned].samples, fastest, strict=True)
    )
    return RegretResult(
        shape=res.shape,
        tuned=res.best,
        best=configs[i_best],
        regret=medians[i_tuned] / medians[i_best] - 1,
        round_regrets=per_round,
        tune_s=tune_s,
        sweep_s=sweep_s,
        configs=len(configs),
        measured=len(res.trials),
    )
