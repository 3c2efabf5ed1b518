"""The timing data set of ConvMeter: zoo families × widths × resolutions × batches, cached.

Each configuration builds a network of the zoo (:mod:`hpcnb.models`) scaled by a width
multiplier, computes its features once per input resolution
(:func:`hpcnb.perfmodel.features.network_features`) and times inference and training at
each batch size (:mod:`hpcnb.perfmodel.timing`) under the noise-aware protocol of
:mod:`hpcnb.perfmodel.protocol`: every timing keeps its samples, their dispersion
(IQR ÷ median), the load average and the thread settings; a noisy one is re-measured a
bounded number of times and flagged if it stays noisy.

Measurements depend on the machine, so they are cached in the one hpcnb cache
(:func:`hpcnb.paths.cache_dir` ``("perfmodel")`` under ``$HPCNB_CACHE``, else the user cache
folder) as ``timings-<key>.json``, where the key is a digest of
:func:`hpcnb.paths.machine_key` (CPU model, cores, architecture) and the torch version.
The file follows the rules of :mod:`hpcnb.cachefile`: it is written atomically (a private
temporary file in the same folder, flushed, then renamed over the old one), and every write
merges under the file's lock (``timings-<key>.json.lock``), reading the file again inside it,
so two runs measuring at once keep each other's timings. Every entry is validated when read
(field types, finite positive samples); entries that do not validate, or a file that is not
a timing cache at all, are dropped with a :class:`~hpcnb.cachefile.CacheWarning` naming the
file, and measured again. A cache that cannot be written (read-only folder, full disk) gives
one warning and the data set is returned uncached.
Entries are keyed by the configuration and the timing settings; a later run with a superset
grid measures only what is missing, and ``remeasure`` says what else to measure again.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hpcnb.cachefile import CacheWarning, CorruptCacheError, best_effort, read_json, update_json
from hpcnb.paths import cache_root, machine_key
from hpcnb.perfmodel.estimator import Measurement
from hpcnb.perfmodel.features import NetworkFeatures, network_features
from hpcnb.perfmodel.protocol import (
    NoisePolicy,
    PerfmodelError,
    ProtocolTiming,
    between_attempt_spread,
    measure_until_quiet,
    preference,
    thread_settings,
)
from hpcnb.perfmodel.timing import TimingConfig, time_inference, time_training
from hpcnb.timing import pinned_threads

#: Format of the cache file; a file of another format is measured afresh. Version 3 keeps
#: every timing's samples, dispersion, load average and thread settings.
CACHE_VERSION = 3
FAMILIES = ("resnet", "vgg", "mobilenet_v2", "shufflenet", "densenet")
REMEASURE = ("noisy", "all", "none")
Remeasure = Literal["noisy", "all", "none"]

__all__ = [
    "FAMILIES",
    "REMEASURE",
    "DatasetSummary",
    "GridConfig",
    "build_network",
    "cache_file",
    "collect_dataset",
    "pruned_variant",
    "summarize",
    "time_network",
]


def _scale(channels: int, width: float, multiple: int = 1) -> int:
    return max(multiple, round(channels * width / multiple) * multiple)


def build_network(
    family: str, width: float = 1.0, in_channels: int = 3, num_classes: int = 10
) -> nn.Module:
    """Build a zoo network of ``family`` with every channel count scaled by ``width``.

    Args:
        family: One of :data:`FAMILIES`.
        width: Channel multiplier (1.0 = the zoo's default size).
        in_channels: Input image channels.
        num_classes: Classifier outputs.

    Raises:
        PerfmodelError: Unknown family or non-positive width.
    """
    from hpcnb import models

    if width <= 0:
        raise PerfmodelError(f"width={width}: expected a positive multiplier")

    def build(factory: Callable[..., nn.Module], **sizes: object) -> nn.Module:
        return factory(**sizes, num_classes=num_classes, in_channels=in_channels)

    if family == "resnet":
        return build(models.resnet_cifar, depth=20, width=_scale(16, width))
    if family == "vgg":
        cfg = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512)
        scaled = tuple(c if c == "M" else _scale(int(c), width) for c in cfg)
        return build(models.vgg, cfg=scaled, hidden=_scale(256, width))
    if family == "mobilenet_v2":
        settings = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 3, 2), (6, 96, 2, 1))
        scaled_settings = tuple((t, _scale(c, width), n, s) for t, c, n, s in settings)
        stem, last = _scale(32, width), _scale(640, width)
        return build(models.mobilenet_v2, settings=scaled_settings, stem=stem, last=last)
    if family == "shufflenet":
        widths = tuple(_scale(c, width, 2) for c in (48, 96, 192))
        stem, last = _scale(24, width), _scale(512, width)
        return build(models.shufflenet, widths=widths, stem=stem, last=last)
    if family == "densenet":
        return build(models.densenet, growth=_scale(12, width), stem=_scale(24, width))
    raise PerfmodelError(f"family={family!r}: expected one of {FAMILIES}")


@dataclass(frozen=True)
class GridConfig:
    """The configurations of the data set.

    Attributes:
        families: Architecture families (see :func:`build_network`).
        widths: Channel multipliers.
        resolutions: Square input sizes in pixels.
        batches: Batch sizes.
        in_channels: Input channels.
        timing: Thread count, warm-up and repeats.
        seed: Seed of weights and inputs.

    Raises:
        PerfmodelError: An unknown family, or a width, resolution or batch out of range.
    """

    families: tuple[str, ...] = FAMILIES
    widths: tuple[float, ...] = (0.25, 0.5)
    resolutions: tuple[int, ...] = (16, 32)
    batches: tuple[int, ...] = (2, 8, 32)
    in_channels: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        for family in self.families:
            if family not in FAMILIES:
                raise PerfmodelError(f"GridConfig.families: {family!r} not in {FAMILIES}")
        if not self.widths or min(self.widths) <= 0:
            raise PerfmodelError(f"GridConfig.widths={self.widths}: need positive multipliers")
        if not self.resolutions or min(self.resolutions) < 8:
            raise PerfmodelError(f"GridConfig.resolutions={self.resolutions}: need sizes >= 8")
        if not self.batches or min(self.batches) < 2:
            raise PerfmodelError(
                f"GridConfig.batches={self.batches}: need sizes >= 2 (BatchNorm in training)"
            )

    @property
    def size(self) -> int:
        """Number of configurations (rows) in the grid."""
        return len(self.families) * len(self.widths) * len(self.resolutions) * len(self.batches)


def cache_file(directory: str | Path | None = None) -> Path:
    """Path of this machine's timing cache file.

    The file name holds a digest of :func:`hpcnb.paths.machine_key` and the torch version:
    timings measured on another machine or with another torch are never read.

    Args:
        directory: Cache root instead of :func:`hpcnb.paths.cache_root` (the file then
            lies in ``directory/perfmodel``).

    Returns:
        The path; its folder is created by the first write, not here.
    """
    folder = Path(directory) if directory else cache_root()
    raw = f"{machine_key()} | torch {torch.__version__}"
    digest = hashlib.sha1(raw.encode()).hexdigest()[:12]
    return folder / "perfmodel" / f"timings-{digest}.json"


_WHAT = "perfmodel timing cache"

_FEATURE_FLOATS = (
    "conv_flops",
    "grouped_conv_flops",
    "linear_flops",
    "other_flops",
    "activation_bytes",
    "memory_bytes",
    "train_flops",
    "train_grouped_flops",
)


def _empty() -> dict[str, dict]:
    return {"features": {}, "timings": {}}


def _number(value: Any, where: str, *, positive: bool = False, finite: bool = True) -> float:
    """``value`` as a float; raise :class:`CorruptCacheError` unless it is a fitting number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CorruptCacheError(f"{where}: expected a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise CorruptCacheError(f"{where}: number out of range") from None
    if finite and not math.isfinite(number):
        raise CorruptCacheError(f"{where}: expected a finite number, got {value!r:.40}")
    if (positive and not number > 0) or number < 0:
        bound = "> 0" if positive else ">= 0"
        raise CorruptCacheError(f"{where}: expected a number {bound}, got {value!r:.40}")
    return number


def _numbers(value: Any, where: str, **kw: bool) -> list[float]:
    if not isinstance(value, list):
        raise CorruptCacheError(f"{where}: expected a list, got {type(value).__name__}")
    return [_number(v, f"{where}[{i}]", **kw) for i, v in enumerate(value)]


def _integer(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise CorruptCacheError(f"{where}: expected an integer >= {low}, got {value!r:.40}")
    return value


def _check_timing(data: Any, where: str) -> ProtocolTiming:
    """A timing entry as a :class:`ProtocolTiming`, or :class:`CorruptCacheError`."""
    if not isinstance(data, dict):
        raise CorruptCacheError(f"{where}: expected an object, got {type(data).__name__}")
    samples = _numbers(data.get("samples"), f"{where}['samples']", positive=True)
    if not samples:
        raise CorruptCacheError(f"{where}['samples']: no samples")
    _number(data.get("dispersion"), f"{where}['dispersion']")
    if len(_numbers(data.get("load"), f"{where}['load']")) != 3:
        raise CorruptCacheError(f"{where}['load']: expected 3 load averages")
    _integer(data.get("cores"), f"{where}['cores']", 1)
    _integer(data.get("attempts", 1), f"{where}['attempts']", 1)
    if not isinstance(data.get("threads", {}), dict):
        raise CorruptCacheError(f"{where}['threads']: expected an object")
    flags = data.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise CorruptCacheError(f"{where}['flags']: expected a list of strings")
    history = data.get("history", [])
    if not isinstance(history, list):
        raise CorruptCacheError(f"{where}['history']: expected a list")
    for i, h in enumerate(history):  # the median is NaN in entries of format 3's first runs
        if len(_numbers(h, f"{where}['history'][{i}]", finite=False)) not in (2, 3):
            raise CorruptCacheError(f"{where}['history'][{i}]: expected 2 or 3 numbers")
    try:
        return ProtocolTiming.from_json(data)
    except PerfmodelError as exc:
        raise CorruptCacheError(f"{where}: {exc}") from None


def _check_timing_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise CorruptCacheError(f"{where}: expected an object, got {type(entry).__name__}")
    _check_timing(entry.get("inference"), f"{where}['inference']")
    _check_timing(entry.get("training"), f"{where}['training']")
    if not isinstance(entry.get("measured_at", ""), str):
        raise CorruptCacheError(f"{where}['measured_at']: expected a string")


def _check_features(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise CorruptCacheError(f"{where}: expected an object, got {type(entry).__name__}")
    for name in ("name", "family"):
        if not isinstance(entry.get(name), str):
            raise CorruptCacheError(f"{where}[{name!r}]: expected a string")
    shape = entry.get("input_shape")
    if not isinstance(shape, list) or not shape:
        raise CorruptCacheError(f"{where}['input_shape']: expected a list of sizes")
    for i, v in enumerate(shape):
        _integer(v, f"{where}['input_shape'][{i}]", 1)
    _integer(entry.get("params"), f"{where}['params']")
    _integer(entry.get("param_tensors", 0), f"{where}['param_tensors']")
    for name in _FEATURE_FLOATS:
        _number(entry.get(name), f"{where}[{name!r}]")
    counts = entry.get("counts", {})
    if not isinstance(counts, dict):
        raise CorruptCacheError(f"{where}['counts']: expected an object")
    for k, v in counts.items():
        _integer(v, f"{where}['counts'][{k[:40]!r}]")
    for name in ("gemm_node_bytes", "other_node_bytes"):
        _numbers(entry.get(name, []), f"{where}[{name!r}]")
    costs = entry.get("group_costs", {})
    if not isinstance(costs, dict):
        raise CorruptCacheError(f"{where}['group_costs']: expected an object")
    for k, v in costs.items():
        if len(_numbers(v, f"{where}['group_costs'][{k[:40]!r}]")) != 3:
            raise CorruptCacheError(f"{where}['group_costs'][{k[:40]!r}]: expected 3 numbers")
    try:
        NetworkFeatures.from_json(entry)
    except (TypeError, ValueError) as exc:
        raise CorruptCacheError(f"{where}: {exc}") from None


class _Checked:
    """Validator of the cache file: keeps the valid entries, notes the dropped ones."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def __call__(self, data: Any) -> dict[str, dict] | None:
        if not isinstance(data, dict):
            raise CorruptCacheError(f"expected an object, got {type(data).__name__}")
        if data.get("version") != CACHE_VERSION:
            return None  # another format: measured afresh (not damage)
        out = _empty()
        for part, check in (("features", _check_features), ("timings", _check_timing_entry)):
            entries = data.get(part, {})
            if not isinstance(entries, dict):
                raise CorruptCacheError(f"{part!r}: expected an object")
            for key, entry in entries.items():
                try:
                    check(entry, f"{part}[{key[:80]!r}]")
                except CorruptCacheError as exc:
                    self.dropped.append(str(exc))
                else:
                    out[part][key] = entry
        return out


def _load_cache(path: Path) -> dict[str, dict]:
    """The valid entries of the cache file (warning about a corrupt file or entries)."""
    checked = _Checked()
    data = read_json(path, checked, what=_WHAT, allow_nan=True, stacklevel=4)
    if checked.dropped:
        warnings.warn(
            f"{_WHAT} {path}: {len(checked.dropped)} entries dropped, they do not validate "
            f"(first: {checked.dropped[0]}); measured again, the file is replaced",
            CacheWarning,
            stacklevel=3,
        )
    return data if data is not None else _empty()


def _save_cache(path: Path, cache: dict[str, dict], changed: dict[str, set[str]]) -> bool:
    """Merge the ``changed`` entries into the file under its lock, written atomically.

    Entries another process wrote since this one read the file are kept; a failure to
    write (read-only folder, full disk) warns once per file and leaves the file as it was.

    Returns:
        Whether the file was written.
    """

    def merge(current: dict[str, dict] | None) -> dict[str, Any]:
        merged = current if current is not None else _empty()
        for part, keys in changed.items():
            merged[part].update({k: cache[part][k] for k in keys})
        return {"version": CACHE_VERSION, **merged}

    with best_effort(path, _WHAT):
        update_json(path, merge, validate=_Checked(), allow_nan=True)
        return True
    return False


def _entry_timings(entry: Any) -> tuple[ProtocolTiming, ProtocolTiming] | None:
    """The two timings of a cache entry, or None when it is malformed."""
    try:
        return (
            ProtocolTiming.from_json(entry["inference"]),
            ProtocolTiming.from_json(entry["training"]),
        )
    except (PerfmodelError, KeyError, TypeError):
        return None


def _better(old: ProtocolTiming, new: ProtocolTiming) -> ProtocolTiming:
    """The better of two timings of one configuration, keeping both histories.

    Better: the smaller :func:`~hpcnb.perfmodel.protocol.preference` (not under load, not
    too dispersed, then the lower median). The attempts of both stay in its history, so the
    spread between runs stays visible.
    """

    def rank(t: ProtocolTiming) -> tuple[bool, bool, float]:
        return preference(t.flags, t.median)

    kept = new if rank(new) <= rank(old) else old
    return replace(kept, attempts=old.attempts + new.attempts, history=old.history + new.history)


@dataclass(frozen=True)
class DatasetSummary:
    """How a data set was measured, for the notebook's noise table.

    Attributes:
        timings: Number of timings (two per configuration).
        noise_floor: Median dispersion (IQR ÷ median) over all timings.
        noisy: Timings still flagged noisy (dispersion or load).
        flagged_dispersion: Timings flagged for dispersion.
        flagged_load: Timings flagged for load above the core count.
        remeasured: Timings that needed more than one attempt.
        max_load: Highest 1-minute load average seen at measurement.
        between_attempts: Median spread of the attempt medians over timings measured more
            than once (:func:`~hpcnb.perfmodel.protocol.between_attempt_spread`; ``nan`` when
            none was): the noise *between* measurements, which the IQR of one burst of
            samples does not see.
    """

    timings: int
    noise_floor: float
    noisy: int
    flagged_dispersion: int
    flagged_load: int
    remeasured: int
    max_load: float
    between_attempts: float


def summarize(rows: Sequence[Measurement]) -> DatasetSummary:
    """Summarise the protocol timings of ``rows`` (see :class:`DatasetSummary`).

    Raises:
        PerfmodelError: A row carries no protocol timing.
    """
    timings = []
    for r in rows:
        for t in (r.inference_timing, r.training_timing):
            if t is None:
                raise PerfmodelError(f"{r.features.name} batch {r.batch}: no protocol timing")
            timings.append(t)
    if not timings:
        raise PerfmodelError("summarize: no rows")
    return DatasetSummary(
        timings=len(timings),
        noise_floor=float(np.median([t.dispersion for t in timings])),
        noisy=sum(t.noisy for t in timings),
        flagged_dispersion=sum("dispersion" in t.flags for t in timings),
        flagged_load=sum("load" in t.flags for t in timings),
        remeasured=sum(t.attempts > 1 for t in timings),
        max_load=float(max(t.load[0] for t in timings)),
        between_attempts=between_attempt_spread(timings),
    )


def collect_dataset(
    grid: GridConfig,
    *,
    use_cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: Callable[[Sequence], Sequence] | None = None,
    remeasure: Remeasure = "noisy",
    policy: NoisePolicy | None = None,
    remeasure_budget_s: float | None = None,
) -> list[Measurement]:
    """Measure every configuration of ``grid`` under the noise protocol, reusing the cache.

    A configuration missing from the cache is always measured (with the protocol's bounded
    re-measures). For cached ones ``remeasure`` decides:

    * ``"noisy"``: measure again those whose inference or training timing is flagged noisy
      (or was measured under load); the better of the old and the new timing is kept
      (:func:`~hpcnb.perfmodel.protocol.preference`: not under load, not too dispersed,
      then faster);
    * ``"all"``: measure every configuration again and keep the new timings;
    * ``"none"``: use the cache as it is.

    Args:
        grid: The configurations and timing settings.
        use_cache: Read and update the on-disk cache of this machine.
        cache_dir: Cache root instead of :func:`hpcnb.paths.cache_root`.
        progress: Wraps the list of configurations (e.g. ``tqdm.auto.tqdm``).
        remeasure: ``"noisy"``, ``"all"`` or ``"none"`` (above).
        policy: Noise thresholds and retry bound (default :class:`NoisePolicy`).
        remeasure_budget_s: Seconds this call may spend measuring *cached* configurations
            again (``None``: no bound). Missing configurations are always measured; on a
            machine that stays loaded, the budget keeps every run's re-measures bounded
            while the data set improves from run to run.

    Returns:
        One :class:`Measurement` per configuration, in grid order, each with its two
        :class:`~hpcnb.perfmodel.protocol.ProtocolTiming`.

    Raises:
        PerfmodelError: ``remeasure`` is not one of :data:`REMEASURE`.
    """
    if remeasure not in REMEASURE:
        raise PerfmodelError(
            f"collect_dataset: remeasure={remeasure!r}, expected one of {REMEASURE}"
        )
    policy = policy or NoisePolicy()
    path = cache_file(cache_dir)
    cache = _load_cache(path) if use_cache else _empty()
    changed: dict[str, set[str]] = {"features": set(), "timings": set()}
    t = grid.timing
    jobs = [(fam, w, r) for fam in grid.families for w in grid.widths for r in grid.resolutions]
    rows: list[Measurement] = []
    spent = 0.0
    budget = float("inf") if remeasure_budget_s is None else float(remeasure_budget_s)
    for fam, w, r in progress(jobs) if progress else jobs:
        name = f"{fam}_w{w:g}_r{r}"
        shape = (grid.in_channels, r, r)
        fkey = f"{name}_c{grid.in_channels}"
        if cache["features"].get(fkey, {}).get("group_costs"):  # older entries lack them
            feats = NetworkFeatures.from_json(cache["features"][fkey])
        else:
            torch.manual_seed(grid.seed)
            feats = network_features(build_network(fam, w, grid.in_channels), shape, name, fam)
            cache["features"][fkey] = feats.to_json()
            changed["features"].add(fkey)
        for b in grid.batches:
            tkey = f"{fkey}_b{b}_t{t.threads}_w{t.warmup}_n{t.repeats}_{t.clock}_s{grid.seed}"
            cached = _entry_timings(cache["timings"].get(tkey))
            again = cached is not None and (
                remeasure == "all"
                or (remeasure == "noisy" and (cached[0].noisy or cached[1].noisy))
            )
            if cached is None or (again and spent < budget):
                start = time.monotonic()
                inf, train = _measure(grid, fam, w, shape, b, policy)
                if cached is not None:
                    spent += time.monotonic() - start
                if cached is not None and remeasure == "noisy":
                    inf, train = _better(cached[0], inf), _better(cached[1], train)
                cache["timings"][tkey] = {
                    "inference": inf.to_json(),
                    "training": train.to_json(),
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                changed["timings"].add(tkey)
            else:
                assert cached is not None
                inf, train = cached
            rows.append(Measurement(feats, b, inf.median, train.median, inf, train))
        dirty = changed["features"] or changed["timings"]
        if use_cache and dirty and _save_cache(path, cache, changed):
            changed = {"features": set(), "timings": set()}
    return rows


def _measure(
    grid: GridConfig,
    family: str,
    width: float,
    shape: tuple[int, ...],
    batch: int,
    policy: NoisePolicy,
) -> tuple[ProtocolTiming, ProtocolTiming]:
    """Time inference and training of one configuration under the noise protocol."""
    t = grid.timing
    gen = torch.Generator().manual_seed(grid.seed)
    x = torch.randn(batch, *shape, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    torch.manual_seed(grid.seed)
    model = build_network(family, width, grid.in_channels)

    seen: dict[str, Any] = {}

    def pinned(run: Callable[[], Sequence[float]]) -> Callable[[], Sequence[float]]:
        def call() -> Sequence[float]:
            with pinned_threads(t.threads, numba=False):
                seen.update(thread_settings(t.threads, t.clock))  # as in force while timing
                return run()

        return call

    def settings() -> dict[str, Any]:
        return dict(seen)

    inf = measure_until_quiet(
        pinned(lambda: time_inference(model, x, t).samples), policy, threads=settings
    )
    train = measure_until_quiet(
        pinned(lambda: time_training(model, x, y, t).samples), policy, threads=settings
    )
    return inf, train


def time_network(
    model: nn.Module,
    input_shape: Sequence[int],
    batch: int,
    timing: TimingConfig,
    policy: NoisePolicy | None = None,
    *,
    seed: int = 0,
) -> ProtocolTiming:
    """Time one ``no_grad`` forward pass of any network under the noise protocol.

    For networks outside the grid (pruned ones, say); nothing is cached.

    Args:
        model: The network (put in eval mode).
        input_shape: One sample's shape.
        batch: Batch size.
        timing: Threads, warm-up, repeats and clock.
        policy: Noise thresholds and retry bound (default :class:`NoisePolicy`).
        seed: Seed of the input.
    """
    x = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(seed))
    seen: dict[str, Any] = {}

    def call() -> Sequence[float]:
        with pinned_threads(timing.threads, numba=False):
            seen.update(thread_settings(timing.threads, timing.clock))
            return time_inference(model, x, timing).samples

    return measure_until_quiet(call, policy or NoisePolicy(), threads=lambda: dict(seen))


def pruned_variant(
    model: nn.Module,
    input_shape: Sequence[int],
    keep_ratio: float | Sequence[float] | Callable[[int], Sequence[float]],
) -> nn.Module:
    """A real, smaller copy of ``model`` with its prunable channel groups shrunk.

    Channel groups come from :mod:`hpcnb.ir` (the same analysis notebook 02 prunes with);
    a group keeps ``max(1, round(ratio · size))`` channels, sliced by
    :func:`hpcnb.ir.extract.extract`.

    Args:
        model: The network.
        input_shape: One sample's shape (for tracing).
        keep_ratio: One ratio for every prunable group (uniform pruning), one ratio per
            prunable group in graph order (a layer-wise plan, as a search produces), or a
            function of the number of groups returning such a plan.

    Raises:
        PerfmodelError: A ratio outside (0, 1], or a plan of the wrong length.
    """
    from hpcnb.ir import trace
    from hpcnb.ir.extract import extract

    model.eval()
    with torch.no_grad():
        graph = trace(model, torch.randn(2, *input_shape))
    groups = [g for g in graph.groups() if g.prunable and g.kind == "channel"]
    if callable(keep_ratio):
        keep_ratio = keep_ratio(len(groups))
    ratios = (
        [float(keep_ratio)] * len(groups)
        if isinstance(keep_ratio, (int, float))
        else [float(r) for r in keep_ratio]
    )
    if len(ratios) != len(groups):
        raise PerfmodelError(f"pruned_variant: {len(ratios)} ratios for {len(groups)} groups")
    if any(not 0 < r <= 1 for r in ratios):
        raise PerfmodelError(f"pruned_variant: ratios must be in (0, 1], got {ratios}")
    keep = {g.id: max(1, round(r * g.size)) for g, r in zip(groups, ratios, strict=True)}
    return extract(model, graph, keep)
