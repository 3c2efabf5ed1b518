"""Latency models for a latency-aware pruning reward, and latency at several input sizes.

A search that only counts FLOPs can cut the FLOPs in half and leave the latency nearly
where it was (per-call overheads, channel counts that fill no vector register, layers
whose cost does not scale with their channels). AMC (He et al., ECCV 2018) put measured
latency in the loop; here the reward of :class:`~hpcnb.pruning.env.PruningEnv` may include a
latency term from any object with the :class:`LatencyModel` interface:
``latency(counts) -> seconds`` for the network pruned to ``counts`` channels per group.

Two implementations:

* :class:`LayerLatencyTable` (the default, our design): every convolution and linear layer
  of the network is timed once on this machine at the target input size, on a small grid of
  (input channels, output channels), with the given batch and thread count; the network's
  latency is the sum of the layers' bilinearly interpolated times plus a constant for the
  rest (normalisation, activations, additions, pooling: the full network's time minus its
  layers' times at full width). Every time is the *fastest* of its interleaved repeats: on a
  shared machine the other processes only ever add time (a descheduled thread stalls every
  barrier of a two-thread run), so the minimum estimates the undisturbed cost, where a
  median over a busy spell can be many times too large. Layers of equal geometry are timed
  once. The
  table, with every point's timing samples, is cached under
  ``hpcnb.paths.cache_root() / "pruning_latency"``, keyed on
  :func:`hpcnb.paths.machine_key`, the thread count, the batch, the input shape and the
  layer geometries. The cache follows :mod:`hpcnb.cachefile`: a table read from it is
  validated (its key, its grids, finite positive times) and one that does not validate is
  measured again with a :class:`~hpcnb.cachefile.CacheWarning` naming the file; writes merge
  under the file's lock and are atomic; a folder that cannot be written gives one warning
  and an uncached table.
* :class:`PredictedLatency`: ``hpcnb.perfmodel.predict_latency(model, input_shape, batch,
  threads)`` on the extracted network, where that function exists (ConvMeter, notebook 03).

:func:`latency_table_by_size` times the original and pruned networks at several input sizes
and batch sizes, interleaved (global average pooling makes these networks accept any input
size, and the pruned topology does not depend on it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from hpcnb.cachefile import CorruptCacheError, best_effort, read_json, update_json
from hpcnb.errors import HpcnbError
from hpcnb.paths import cache_root, machine_key
from hpcnb.pruning.training import measure_latency
from hpcnb.timing import interleaved, pinned_threads

if TYPE_CHECKING:
    import pandas as pd

    from hpcnb.pruning.task import ModelPruningTask

__all__ = [
    "LatencyModel",
    "LatencyModelError",
    "LayerLatencyTable",
    "LayerTiming",
    "PredictedLatency",
    "latency_table_by_size",
]

GRID_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)
"""Channel fractions at which each prunable axis of a layer is timed."""


class LatencyModelError(HpcnbError, ValueError):
    """A latency model cannot be built or asked (bad sizes, no predictor)."""


@runtime_checkable
class LatencyModel(Protocol):
    """What the latency-aware reward needs: seconds for per-group kept channel counts."""

    def latency(self, counts: np.ndarray) -> float:
        """Seconds per forward pass of the network pruned to ``counts`` channels per group."""
        ...


def _grid(size: int) -> list[int]:
    return sorted({int(np.clip(round(size * f), 1, size)) for f in GRID_FRACTIONS})


@dataclass(frozen=True)
class LayerTiming:
    """One layer's measured time on a grid of (input, output) channel counts.

    Attributes:
        name: Module name in the network.
        out_group: Group index whose count sets the output channels (-1: fixed).
        in_group: Group index whose count sets the input channels (-1: fixed).
        in_grid: Input channel counts timed.
        out_grid: Output channel counts timed.
        seconds: ``(len(in_grid), len(out_grid))`` seconds per call (fastest repeat).
        spread: The same shape: (75th - 25th percentile) / median of each point's samples.
    """

    name: str
    out_group: int
    in_group: int
    in_grid: tuple[int, ...]
    out_grid: tuple[int, ...]
    seconds: np.ndarray = field(repr=False)
    spread: np.ndarray = field(repr=False)

    def at(self, cin: float, cout: float) -> float:
        """Bilinear interpolation (clamped at the grid's ends) at ``(cin, cout)``.

        Args:
            cin: Input channels kept.
            cout: Output channels kept.
        """
        rows = np.array([np.interp(cout, self.out_grid, row) for row in self.seconds])
        return float(np.interp(cin, self.in_grid, rows))


def _layer_specs(task: ModelPruningTask, example: torch.Tensor) -> list[dict]:
    """Geometry and groups of every conv / linear layer at the input ``example``."""
    shapes: dict[str, tuple[int, ...]] = {}
    hooks = []
    layers = {n: m for n, m in task.model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}
    for name, module in layers.items():
        hooks.append(
            module.register_forward_hook(
                lambda _m, inp, _out, name=name: shapes.__setitem__(name, tuple(inp[0].shape))
            )
        )
    try:
        with torch.no_grad():
            task.model.eval()(example)
    finally:
        for h in hooks:
            h.remove()
    specs = []
    for name, module in layers.items():
        if name not in shapes:
            continue
        out_group, in_group = task.layer_groups(f"{name}.weight")
        if isinstance(module, nn.Conv2d):
            geometry = {
                "kind": "conv",
                "cin": module.in_channels,
                "cout": module.out_channels,
                "kernel": list(module.kernel_size),
                "stride": list(module.stride),
                "padding": list(module.padding) if not isinstance(module.padding, str) else 0,
                "dilation": list(module.dilation),
                "depthwise": module.groups > 1 and module.groups == module.in_channels,
                "groups": module.groups,
                "bias": module.bias is not None,
                "input": list(shapes[name]),
            }
            if module.groups > 1 and not geometry["depthwise"]:
                out_group, in_group = -1, -1  # grouped, not depthwise: timed at full width only
        else:
            geometry = {
                "kind": "linear",
                "cin": module.in_features,
                "cout": module.out_features,
                "bias": module.bias is not None,
                "input": list(shapes[name]),
            }
        if geometry.get("depthwise"):
            in_group = -1  # a depthwise layer's input count follows its output count
        specs.append(
            {"name": name, "out_group": out_group, "in_group": in_group, "geometry": geometry}
        )
    return specs


def _layer_call(geometry: dict, cin: int, cout: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    shape = list(geometry["input"])
    shape[0] = batch
    if geometry["kind"] == "linear":
        shape[-1] = cin
        return nn.Linear(cin, cout, bias=geometry["bias"]).eval(), torch.randn(*shape)
    groups = cout if geometry["depthwise"] else geometry["groups"]
    pad = geometry["padding"]
    cin = cout if geometry["depthwise"] else cin
    shape[1] = cin
    module = nn.Conv2d(
        cin,
        cout,
        tuple(geometry["kernel"]),
        stride=tuple(geometry["stride"]),
        padding=pad if isinstance(pad, int) else tuple(pad),
        dilation=tuple(geometry["dilation"]),
        groups=groups,
        bias=geometry["bias"],
    ).eval()
    return module, torch.randn(*shape)


def _spread(samples: Sequence[float]) -> float:
    q25, q50, q75 = np.quantile(np.asarray(samples), [0.25, 0.5, 0.75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


@torch.no_grad()
def _time_geometry(
    geometry: dict, in_grid: list[int], out_grid: list[int], batch: int, repeats: int
) -> dict:
    points = [(ci, co) for ci in in_grid for co in out_grid]
    calls = {}
    for ci, co in points:
        module, x = _layer_call(geometry, ci, co, batch)
        calls[(ci, co)] = lambda module=module, x=x: module(x)
    timings = interleaved(calls, repeats=repeats, warmup=2)
    return {
        "in_grid": in_grid,
        "out_grid": out_grid,
        "samples": [list(timings[p].samples) for p in points],
    }


_WHAT = "pruning latency table"


def _gkey(spec: dict) -> str:
    """Cache key of a layer's timed grid: its geometry and which axes are pruned."""
    return json.dumps(
        [spec["geometry"], spec["out_group"] >= 0, spec["in_group"] >= 0], sort_keys=True
    )


def _times(value: object, where: str, *, low: float = 0.0, strict: bool = True) -> list[float]:
    """A non-empty list of finite numbers above ``low``, or :class:`CorruptCacheError`."""
    if not isinstance(value, list) or not value:
        raise CorruptCacheError(f"{where}: expected a non-empty list of numbers")
    out = []
    for i, v in enumerate(value):
        ok = not isinstance(v, bool) and isinstance(v, int | float)
        try:
            ok = ok and math.isfinite(v) and (v > low if strict else v >= low)
        except OverflowError:
            ok = False
        if not ok:
            bound = f"> {low:g}" if strict else f">= {low:g}"
            raise CorruptCacheError(f"{where}[{i}]: expected a finite number {bound}")
        out.append(float(v))
    return out


def _sizes(value: object, where: str) -> list[int]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise CorruptCacheError(f"{where}: expected a non-empty list of channel counts")
    return list(value)


def _check_table(data: object, key: dict, needed: set[str]) -> dict:
    """Validate a cached table for ``key`` holding the grids ``needed``; return it."""
    if not isinstance(data, dict):
        raise CorruptCacheError(f"expected an object, got {type(data).__name__}")
    if data.get("key") != key:
        raise CorruptCacheError("its key is not this network's and settings'")
    geometries = data.get("geometries")
    if not isinstance(geometries, dict):
        raise CorruptCacheError("'geometries': expected an object")
    missing = needed - set(geometries)
    if missing:
        raise CorruptCacheError(f"'geometries': no timing of layer {sorted(missing)[0][:80]}")
    for gkey, point in geometries.items():
        where = f"geometries[{gkey[:60]!r}]"
        if not isinstance(point, dict):
            raise CorruptCacheError(f"{where}: expected an object")
        in_grid = _sizes(point.get("in_grid"), f"{where}['in_grid']")
        out_grid = _sizes(point.get("out_grid"), f"{where}['out_grid']")
        samples = point.get("samples")
        if not isinstance(samples, list) or len(samples) != len(in_grid) * len(out_grid):
            raise CorruptCacheError(
                f"{where}['samples']: expected {len(in_grid) * len(out_grid)} lists of times"
            )
        for i, s in enumerate(samples):
            _times(s, f"{where}['samples'][{i}]")
    _times(data.get("full"), "'full'")
    load = data.get("load_average", [])
    if load != []:
        _times(load, "'load_average'", strict=False)
    return data


class LayerLatencyTable:
    """Per-layer latency table of one network at one input size (a :class:`LatencyModel`).

    Build it with :meth:`measure`. ``latency(counts)`` sums, over the conv and linear
    layers, each layer's time interpolated at its kept (input, output) channels, plus
    :attr:`constant` (the rest of the network at full width, held fixed).

    Attributes:
        layers: One :class:`LayerTiming` per conv / linear layer.
        constant: Seconds of everything but those layers (the full network's fastest run
            minus the layers' times at full width, at least 0).
        full_samples: Timing samples of the full network, seconds.
        key: The cache key (machine, threads, batch, input shape, geometries).
        cached: Whether the table came from the cache.
        load_average: The machine's 1, 5 and 15-minute load averages when it was measured.
    """

    def __init__(
        self,
        layers: list[LayerTiming],
        constant: float,
        full_samples: tuple[float, ...],
        key: dict,
        cached: bool = False,
    ) -> None:
        self.layers = layers
        self.constant = constant
        self.full_samples = full_samples
        self.key = key
        self.cached = cached
        self.load_average: tuple[float, ...] = ()

    @property
    def noise(self) -> float:
        """Median relative inter-quartile spread of the timed points (timing noise)."""
        spreads = np.concatenate([layer.spread.ravel() for layer in self.layers])
        return float(np.median(spreads)) if spreads.size else 0.0

    def latency(self, counts: np.ndarray) -> float:
        """Seconds per forward pass of the network pruned to ``counts`` per group."""
        counts = np.asarray(counts, dtype=np.float64)
        total = self.constant
        for layer in self.layers:
            cin = counts[layer.in_group] if layer.in_group >= 0 else layer.in_grid[-1]
            cout = counts[layer.out_group] if layer.out_group >= 0 else layer.out_grid[-1]
            total += layer.at(cin, cout)
        return float(total)

    @classmethod
    @torch.no_grad()
    def measure(
        cls,
        task: ModelPruningTask,
        input_shape: Sequence[int],
        *,
        batch: int = 1,
        threads: int = 2,
        repeats: int = 9,
        cache: bool = True,
    ) -> LayerLatencyTable:
        """Time every conv / linear layer of ``task.model`` on a channel grid (or load it).

        Args:
            task: The pruning task (its groups say which axis each count sets).
            input_shape: One input's shape ``(channels, height, width)``.
            batch: Batch size of the timed calls.
            threads: Torch threads while timing.
            repeats: Interleaved timed rounds per grid point (after 2 warm-up rounds).
            cache: Read and write the cache under ``cache_root() / "pruning_latency"``; a
                cached table that does not validate is measured again (with a
                :class:`~hpcnb.cachefile.CacheWarning`), a folder that cannot be written
                leaves the table uncached (one warning).

        Raises:
            LatencyModelError: A bad batch, repeat count or input shape.
        """
        if batch < 1 or repeats < 1 or len(input_shape) < 1:
            raise LatencyModelError(
                f"LayerLatencyTable.measure: batch={batch}, repeats={repeats}, "
                f"input_shape={tuple(input_shape)}: expected batch >= 1, repeats >= 1 and a shape"
            )
        example = torch.zeros(batch, *input_shape)
        specs = _layer_specs(task, example)
        key = {
            "machine": machine_key(),
            "threads": threads,
            "batch": batch,
            "input_shape": list(input_shape),
            "repeats": repeats,
            "estimator": "min-v2",
            "torch": torch.__version__,
            "geometries": [s["geometry"] for s in specs],
            "sizes": [int(s) for s in task.group_sizes],
            "groups": [[s["out_group"], s["in_group"]] for s in specs],
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        path = cache_root() / "pruning_latency" / f"table_{digest}.json"
        needed = {_gkey(spec) for spec in specs}

        def valid(found: object) -> dict:
            return _check_table(found, key, needed)

        data = read_json(path, valid, what=_WHAT, stacklevel=4) if cache else None
        cached = data is not None
        if data is None:
            data = {"key": key, "geometries": {}, "full": []}
            with pinned_threads(threads, numba=False, blas=False):
                for spec in specs:
                    g = spec["geometry"]
                    gkey = _gkey(spec)
                    if gkey in data["geometries"]:
                        continue
                    in_grid = _grid(g["cin"]) if spec["in_group"] >= 0 else [g["cin"]]
                    out_grid = _grid(g["cout"]) if spec["out_group"] >= 0 else [g["cout"]]
                    data["geometries"][gkey] = _time_geometry(g, in_grid, out_grid, batch, repeats)
                model = task.model.eval()
                full = interleaved([lambda: model(example)], repeats=3 * repeats, warmup=2)[0]
                data["full"] = list(full.samples)
            data["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else []
            if cache:
                measured = data

                def merge(current: dict | None) -> dict:
                    # a table another process wrote meanwhile keeps its grids; ours win
                    kept = current["geometries"] if current is not None else {}
                    return {**measured, "geometries": {**kept, **measured["geometries"]}}

                with best_effort(path, _WHAT):
                    update_json(path, merge, validate=valid)
        layers = []
        for spec in specs:
            point = data["geometries"][_gkey(spec)]
            shape = (len(point["in_grid"]), len(point["out_grid"]))
            samples = point["samples"]
            layers.append(
                LayerTiming(
                    name=spec["name"],
                    out_group=spec["out_group"],
                    in_group=spec["in_group"],
                    in_grid=tuple(point["in_grid"]),
                    out_grid=tuple(point["out_grid"]),
                    seconds=np.array([np.min(s) for s in samples]).reshape(shape),
                    spread=np.array([_spread(s) for s in samples]).reshape(shape),
                )
            )
        fastest = float(np.min(data["full"]))
        at_full = sum(float(layer.seconds[-1, -1]) for layer in layers)
        table = cls(layers, max(0.0, fastest - at_full), tuple(data["full"]), key, cached)
        table.load_average = tuple(data.get("load_average", ()))
        return table


class PredictedLatency:
    """A :class:`LatencyModel` from ``hpcnb.perfmodel.predict_latency`` (where it exists).

    Each query extracts the pruned network (``task.extract``) and asks the performance
    model (its ``seconds``, where it answers with an estimate and an interval); answers
    are memoised per count vector. Its first use fits the kernel-level model on this
    machine's cached kernel samples and network timings, which notebook 03 measures
    (minutes when the cache is empty).

    Args:
        task: The pruning task.
        input_shape: One input's shape ``(channels, height, width)``.
        batch: Batch size to predict for.
        threads: Thread count to predict for.

    Raises:
        LatencyModelError: ``hpcnb.perfmodel`` has no ``predict_latency``.
    """

    def __init__(
        self, task: ModelPruningTask, input_shape: Sequence[int], batch: int = 1, threads: int = 2
    ) -> None:
        import hpcnb.perfmodel as perfmodel

        predict = getattr(perfmodel, "predict_latency", None)
        if predict is None:
            raise LatencyModelError(
                "PredictedLatency: hpcnb.perfmodel has no predict_latency; use LayerLatencyTable"
            )
        self._predict = predict
        self.task = task
        self.input_shape = tuple(input_shape)
        self.batch = batch
        self.threads = threads
        self._memo: dict[tuple[int, ...], float] = {}

    def latency(self, counts: np.ndarray) -> float:
        """Predicted seconds of the network pruned to ``counts`` channels per group."""
        key = tuple(int(c) for c in np.asarray(counts))
        if key not in self._memo:
            model = self.task.extract(np.asarray(key), ratios=False)
            answer = self._predict(model, self.input_shape, self.batch, self.threads)
            self._memo[key] = float(getattr(answer, "seconds", answer))
        return self._memo[key]


def latency_table_by_size(
    models: Mapping[str, nn.Module],
    in_channels: int,
    sizes: Sequence[int] = (8, 32, 112),
    batches: Sequence[int] = (1, 8),
    *,
    threads: int = 2,
    repeats: int = 15,
    baseline: str = "original",
) -> pd.DataFrame:
    """Time every model at several square input sizes and batch sizes, interleaved.

    At each (size, batch) all models run round-robin (:func:`hpcnb.timing.interleaved`
    through :func:`~hpcnb.pruning.training.measure_latency`); a model's speed-up samples
    are the per-round ratios ``baseline / model``.

    Args:
        models: Name -> network accepting ``(batch, in_channels, size, size)``.
        in_channels: Input channels.
        sizes: Square input sizes (height = width).
        batches: Batch sizes.
        threads: Torch threads while timing.
        repeats: Timed rounds per setting (fewer, at least 3, for inputs above 64 pixels).
        baseline: The model the speed-ups are relative to.

    Returns:
        One row per (size, batch, model): ``latency_ms``, ``speedup``, ``speedup_low``,
        ``speedup_high`` (95 % bootstrap interval of the median ratio) and
        ``speedup_samples``.

    Raises:
        LatencyModelError: ``baseline`` is not among the models.
    """
    import pandas as pd

    from hpcnb.stats import median_interval

    if baseline not in models:
        raise LatencyModelError(f"latency_table_by_size: no model named {baseline!r}")
    rows = []
    for size in sizes:
        for batch in batches:
            example = torch.randn(batch, in_channels, size, size)
            reps = repeats if size <= 64 else max(3, repeats // 3)
            timed = measure_latency(dict(models), example, repeats=reps, warmup=2, threads=threads)
            base = np.asarray(timed[baseline].samples_s)
            for name, result in timed.items():
                samples = tuple(float(r) for r in base / np.asarray(result.samples_s))
                speedup = median_interval(samples)
                low, high = speedup.interval or (speedup.value, speedup.value)
                rows.append(
                    {
                        "size": size,
                        "batch": batch,
                        "model": name,
                        "latency_ms": 1e3 * result.median_s,
                        "speedup": speedup.value,
                        "speedup_low": low,
                        "speedup_high": high,
                        "speedup_samples": samples,
                    }
                )
    return pd.DataFrame(rows)
