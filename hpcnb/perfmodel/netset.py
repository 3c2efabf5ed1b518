"""The zoo's networks timed round-robin for a shared VM, with the noise ceiling they imply.

Every configuration of a :class:`~hpcnb.perfmodel.dataset.GridConfig` (family × width ×
resolution × batch) gets two callables, one inference pass and one training step, and all
of them are timed together by :func:`~hpcnb.perfmodel.roundrobin.measure_round_robin`:
at least three rounds spread over the whole run, in each every callable's repeat count
grown until a sample lasts 50 ms, a fixed reference kernel before and after, slow rounds
timed again, the minimum of round medians kept. Timings are cached per machine, torch
version and protocol (``networks-<key>.json``); the file records the protocol and the
load before every round.

:func:`noise_ceiling` asks what a *perfect* predictor would score here: against one
round's median (one measurement), the value the other rounds give (their minimum, the
protocol's own estimate) is what a predictor that knew the network's true time at best
matches. Its share within ±10 % and its MAPE bound the accuracy figures from above.

Example:
    >>> ape = noise_ceiling([(1.0, 1.02, 1.3), (2.0, 2.1, 2.05)])
    >>> [round(float(v), 3) for v in ape]
    [0.02, 0.02, 0.231, 0.025, 0.048, 0.024]
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcnb.cachefile import CorruptCacheError
from hpcnb.paths import machine_key
from hpcnb.perfmodel.aten import KernelCall, network_kernels
from hpcnb.perfmodel.dataset import GridConfig, build_network
from hpcnb.perfmodel.estimator import Measurement
from hpcnb.perfmodel.features import network_features
from hpcnb.perfmodel.kernelset import cached_entries, save_entries
from hpcnb.perfmodel.protocol import PerfmodelError, ProtocolTiming, dispersion, steady_allocator
from hpcnb.perfmodel.roundrobin import (
    REFERENCE,
    RoundRobinPolicy,
    RoundRobinResult,
    measure_round_robin,
    reference_kernel,
)
from hpcnb.perfmodel.timing import training_step
from hpcnb.timing import pinned_threads

__all__ = ["NETWORK_POLICY", "NetworkSet", "collect_networks", "noise_ceiling", "time_models"]

#: The protocol of network timings: 3 rounds of 3 samples of at least 50 ms each; a round
#: whose reference is 15 % slower than the fastest is timed again (up to 6 times).
NETWORK_POLICY = RoundRobinPolicy(
    rounds=3, samples=3, min_sample_seconds=0.05, reference_slack=1.15, max_reruns=6
)
NETWORK_CACHE_VERSION = 1


def noise_ceiling(rounds: Sequence[Sequence[float]]) -> np.ndarray:
    """Per (timing, round), ``|min(other rounds) / this round - 1|``: a perfect predictor's error.

    Args:
        rounds: Per timing, its kept round medians (timings with fewer than 2 are skipped).

    Raises:
        PerfmodelError: A median that is not positive.
    """
    out = []
    for medians in rounds:
        r = np.asarray(medians, dtype=np.float64)
        if (r <= 0).any():
            raise PerfmodelError(f"noise_ceiling: round medians {r} must be positive")
        if r.size < 2:
            continue
        for i in range(r.size):
            out.append(abs(float(np.delete(r, i).min()) / float(r[i]) - 1.0))
    return np.asarray(out)


@dataclass
class NetworkSet:
    """Timed networks of a grid.

    Attributes:
        rows: One :class:`~hpcnb.perfmodel.estimator.Measurement` per configuration (the
            timings' samples are the kept round medians).
        rounds: ``(name, batch, mode)`` -> kept round medians.
        protocol: How the timings were measured.
        seconds_spent: Seconds of timing in this process.
        reruns: Slow rounds timed again.
        loads: 1-minute load average before each round.
        kernels: ``(index, mode)`` -> the row's captured ATen calls (filled by :meth:`calls`).
    """

    rows: list[Measurement]
    rounds: dict[tuple[str, int, str], tuple[float, ...]]
    protocol: dict[str, Any]
    seconds_spent: float = 0.0
    reruns: int = 0
    loads: list[float] = field(default_factory=list)
    kernels: dict[tuple[int, str], list[KernelCall]] = field(default_factory=dict, repr=False)

    def calls(self, index: int, mode: str) -> list[KernelCall]:
        """The ATen calls of row ``index`` in ``mode`` (captured once, then kept).

        Args:
            index: Row index.
            mode: ``"inference"`` or ``"training"``.
        """
        if (index, mode) not in self.kernels:
            r = self.rows[index]
            torch.manual_seed(0)
            net = build_network(r.family, _width(r.features.name))
            self.kernels[(index, mode)] = network_kernels(
                net, r.features.input_shape, r.batch, mode
            )
        return self.kernels[(index, mode)]

    def ceiling(self, mode: str) -> np.ndarray:
        """:func:`noise_ceiling` of this set's timings in ``mode``.

        Args:
            mode: ``"inference"`` or ``"training"``.
        """
        return noise_ceiling([v for (_, _, m), v in self.rounds.items() if m == mode])


def _width(name: str) -> float:
    return float(name.split("_w")[-1].split("_")[0])


def _name(family: str, width: float, res: int) -> str:
    return f"{family}_w{width:g}_r{res}"


def _validate(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("version") != NETWORK_CACHE_VERSION:
        raise CorruptCacheError("not a network timing cache of this version")
    for key, e in data["entries"].items():
        rounds = [float(v) for v in e["rounds"]]
        if len(rounds) < 1 or min(rounds) <= 0:
            raise CorruptCacheError(f"entry {key}: bad round medians")
    return data


def _callables(
    grid: GridConfig, keys: Sequence[tuple[str, float, int, int, str]]
) -> dict[str, Callable[[], object]]:
    out: dict[str, Callable[[], object]] = {}
    for family, width, res, batch, mode in keys:
        torch.manual_seed(grid.seed)
        net = build_network(family, width, grid.in_channels)
        gen = torch.Generator().manual_seed(grid.seed)
        x = torch.randn(batch, grid.in_channels, res, res, generator=gen)
        key = "|".join(map(str, (family, width, res, batch, mode)))
        if mode == "inference":
            net.eval()

            def run(net: Any = net, x: torch.Tensor = x) -> object:
                with torch.no_grad():
                    return net(x)

            out[key] = run
        else:
            y = torch.randint(0, 10, (batch,), generator=gen)
            out[key] = training_step(net, x, y)
    return out


def collect_networks(
    grid: GridConfig,
    *,
    policy: RoundRobinPolicy = NETWORK_POLICY,
    cache: bool | str | Path = True,
) -> NetworkSet:
    """Time inference and training of every grid configuration round-robin (cached).

    Args:
        grid: Families, widths, resolutions, batches; ``grid.timing.threads`` threads (the
            process CPU clock for one thread, else the wall clock).
        policy: Round-robin settings (default :data:`NETWORK_POLICY`).
        cache: ``True`` (this machine's cache folder), a folder, or ``False``.
    """
    threads = grid.timing.threads
    clock_name = "cpu" if threads == 1 else "wall"
    protocol = {
        "policy": dataclasses.asdict(policy),
        "threads": threads,
        "clock": clock_name,
        "machine": machine_key(),
        "torch": torch.__version__,
        "allocator": steady_allocator(),
        "reference": REFERENCE,
        "seed": grid.seed,
        "version": NETWORK_CACHE_VERSION,
    }
    path, entries = cached_entries(cache, "networks", protocol, _validate)
    keys = [
        (f, w, r, b, m)
        for f in grid.families
        for w in grid.widths
        for r in grid.resolutions
        for b in grid.batches
        for m in ("inference", "training")
    ]
    todo = [k for k in keys if "|".join(map(str, k)) not in entries]
    out = NetworkSet([], {}, protocol)
    if todo:
        started = time.perf_counter()
        clock = time.process_time if clock_name == "cpu" else time.perf_counter
        with pinned_threads(threads, numba=False):
            result = measure_round_robin(
                _callables(grid, todo), reference_kernel(grid.seed), policy, clock=clock
            )
        out.seconds_spent = time.perf_counter() - started
        out.reruns = result.reruns
        out.loads = [r.load[0] for r in result.rounds]
        new = {
            name: {"rounds": result.round_medians(name), "loads": out.loads}
            for name in result.seconds
        }
        entries.update(new)
        if path is not None:
            save_entries(path, protocol, new, _validate)
    _rows(grid, entries, out)
    return out


def _rows(grid: GridConfig, entries: dict[str, Any], out: NetworkSet) -> None:
    cores = os.cpu_count() or 1
    for f in grid.families:
        for w in grid.widths:
            for r in grid.resolutions:
                torch.manual_seed(grid.seed)
                net = build_network(f, w, grid.in_channels)
                shape = (grid.in_channels, r, r)
                feats = network_features(net, shape, name=_name(f, w, r), family=f)
                for b in grid.batches:
                    timings = []
                    for m in ("inference", "training"):
                        e = entries["|".join(map(str, (f, w, r, b, m)))]
                        rounds = tuple(e["rounds"])
                        out.rounds[(feats.name, b, m)] = rounds
                        load = float(e["loads"][0]) if e.get("loads") else float("nan")
                        timings.append(
                            ProtocolTiming(
                                samples=rounds,
                                dispersion=dispersion(rounds),
                                load=(load, load, load),
                                cores=cores,
                                threads={"torch": grid.timing.threads},
                                attempts=len(rounds),
                                history=tuple((0.0, load, v) for v in rounds),
                            )
                        )
                    inf, train = timings
                    out.rows.append(
                        Measurement(feats, b, min(inf.samples), min(train.samples), inf, train)
                    )


def time_models(
    models: Mapping[str, nn.Module],
    input_shape: Sequence[int],
    batch: int,
    *,
    policy: RoundRobinPolicy = NETWORK_POLICY,
    threads: int = 1,
    seed: int = 0,
) -> RoundRobinResult:
    """Time one ``no_grad`` forward pass of each model round-robin (not cached).

    For networks outside the grid (pruned ones, say), under the same protocol.

    Args:
        models: Name -> network (put in eval mode).
        input_shape: One sample's shape.
        batch: Batch size.
        policy: Round-robin settings.
        threads: Threads of torch and BLAS (1: the process CPU clock).
        seed: Seed of the input.
    """
    steady_allocator()
    x = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(seed))
    runs = {}
    for name, net in models.items():
        net.eval()

        def run(net: nn.Module = net) -> object:
            with torch.no_grad():
                return net(x)

        runs[name] = run
    clock = time.process_time if threads == 1 else time.perf_counter
    with pinned_threads(threads, numba=False):
        return measure_round_robin(runs, reference_kernel(seed), policy, clock=clock)
