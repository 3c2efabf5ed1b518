"""Kernel configurations sampled independently of any network, timed round-robin, cached.

nn-Meter fits its kernel predictors on configurations drawn from ranges of their own, not
on the networks it is later asked about. Here the configurations are small *primitives*
(:class:`Primitive`): a convolution block (convolution, batch norm, activation), a pooling
layer, a linear layer with a cross-entropy loss, a residual add, a channel concatenation
and a channel shuffle, each with its batch, channels, image size, kernel, stride and
grouping drawn from :class:`SamplingRanges`. Each primitive is run once under
:func:`hpcnb.perfmodel.aten.capture`, forward only (``"inference"``) or forward, backward
and an SGD step (``"training"``), and every ATen call it makes becomes a kernel sample.

:func:`profile_kernels` times the samples with
:func:`~hpcnb.perfmodel.roundrobin.measure_round_robin` in chunks (every kernel of a chunk
once per round, at least three rounds, a fixed reference kernel at both ends of every round,
slow rounds timed again), keeps the minimum of round medians, and caches the result per
machine, torch version and protocol (``kernels-<key>.json`` beside the network timings): the
file records how it was measured.

Example:
    >>> import numpy as np
    >>> p = sample_primitives(np.random.default_rng(0), 3, SamplingRanges())
    >>> {q.kind for q in p} <= set(PRIMITIVE_KINDS)
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcnb.cachefile import CorruptCacheError, best_effort, read_json, update_json
from hpcnb.paths import cache_dir, machine_key
from hpcnb.perfmodel.aten import KernelCall, capture, kernel_features, replay
from hpcnb.perfmodel.protocol import PerfmodelError, load_average
from hpcnb.perfmodel.roundrobin import (
    REFERENCE,
    RoundRobinPolicy,
    measure_round_robin,
    reference_kernel,
)
from hpcnb.timing import pinned_threads

__all__ = [
    "KERNEL_POLICY",
    "PRIMITIVE_KINDS",
    "KernelSample",
    "KernelProfile",
    "Primitive",
    "SamplingRanges",
    "cached_entries",
    "kernel_calls",
    "neighbours",
    "profile_kernels",
    "sample_primitives",
    "save_entries",
]

PRIMITIVE_KINDS = ("conv", "pool", "linear", "add", "cat", "shuffle")
_KIND_WEIGHTS = (0.62, 0.1, 0.08, 0.08, 0.06, 0.06)
KERNEL_CACHE_VERSION = 2
#: The protocol of kernel timings: 3 rounds of 1 sample of at least 5 ms; a round whose
#: reference is 15 % slower than the fastest is timed again (up to 6 times per chunk).
KERNEL_POLICY = RoundRobinPolicy(
    rounds=3, samples=1, min_sample_seconds=0.005, reference_slack=1.15, max_reruns=6
)


@dataclass(frozen=True)
class SamplingRanges:
    """Where kernel configurations are drawn from (log-uniform between the bounds).

    Attributes:
        batch: Smallest and largest batch.
        size: Smallest and largest image side.
        channels: Smallest and largest channel count.
        kernels: Convolution kernel sides and their probabilities.
        stride2: Probability of stride 2.
        depthwise: Probability that a convolution is depthwise.
        max_flops: Largest FLOPs of one convolution (keeps each kernel short).
        max_elements: Largest elements of one activation tensor.
    """

    batch: tuple[int, int] = (1, 64)
    size: tuple[int, int] = (2, 64)
    channels: tuple[int, int] = (3, 512)
    kernels: tuple[tuple[int, float], ...] = ((1, 0.35), (3, 0.45), (5, 0.1), (7, 0.1))
    stride2: float = 0.3
    depthwise: float = 0.25
    max_flops: float = 2e9
    max_elements: int = 4_000_000


@dataclass(frozen=True)
class Primitive:
    """One sampled configuration.

    Attributes:
        kind: One of :data:`PRIMITIVE_KINDS`.
        batch: Batch size.
        c_in: Input channels (features, for a linear layer).
        c_out: Output channels (classes, for a linear layer).
        size: Image side.
        kernel: Kernel (or pooling window) side.
        stride: Stride.
        depthwise: A depthwise convolution (``c_out == c_in``, groups ``c_in``).
        variant: Activation of a convolution block (``relu``, ``relu6``, ``none``) or the
            pooling kind (``max``, ``avg``, ``mean``).
        input_grad: In training, whether the input needs a gradient (not for a first layer).
    """

    kind: str
    batch: int
    c_in: int
    c_out: int
    size: int
    kernel: int = 1
    stride: int = 1
    depthwise: bool = False
    variant: str = "relu"
    input_grad: bool = True


def _log_int(rng: np.random.Generator, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _conv_flops(p: Primitive) -> float:
    out = math.ceil(p.size / p.stride) ** 2
    per = (1 if p.depthwise else p.c_in) * p.kernel**2
    return 2.0 * p.batch * p.c_out * out * per


def _fits(p: Primitive, r: SamplingRanges) -> bool:
    elements = p.batch * max(p.c_in, p.c_out) * p.size**2
    if p.kind == "linear":
        return p.batch * max(p.c_in, p.c_out) <= r.max_elements
    if elements > r.max_elements:
        return False
    return p.kind != "conv" or _conv_flops(p) <= r.max_flops


def _draw(rng: np.random.Generator, r: SamplingRanges) -> Primitive:
    kind = str(rng.choice(PRIMITIVE_KINDS, p=_KIND_WEIGHTS))
    batch = _log_int(rng, *r.batch)
    c_in, c_out = _log_int(rng, *r.channels), _log_int(rng, *r.channels)
    size = _log_int(rng, *r.size)
    sides, probs = zip(*r.kernels, strict=True)
    kernel = int(rng.choice(sides, p=np.asarray(probs) / sum(probs)))
    stride = 2 if rng.random() < r.stride2 and size > 1 else 1
    grad = bool(rng.random() < 0.85)
    batch = max(batch, 2) if math.ceil(size / stride) == 1 else batch  # batch norm needs 2 values
    if kind == "conv":
        dw = bool(rng.random() < r.depthwise)
        act = str(rng.choice(("relu", "relu6", "none"), p=(0.5, 0.25, 0.25)))
        return Primitive(
            kind, batch, c_in, c_in if dw else c_out, size, kernel, stride, dw, act, grad
        )
    if kind == "pool":
        variant = str(rng.choice(("max", "avg", "mean")))
        return Primitive(
            kind,
            batch,
            c_in,
            c_in,
            max(size, 2),
            2 + int(rng.random() < 0.4),
            2,
            False,
            variant,
            grad,
        )
    if kind == "linear":
        return Primitive(
            kind, batch, _log_int(rng, 8, 4096), _log_int(rng, 2, 1000), 1, input_grad=grad
        )
    return Primitive(kind, batch, c_in + c_in % 2, c_in + c_in % 2, size, input_grad=grad)


def sample_primitives(rng: np.random.Generator, n: int, ranges: SamplingRanges) -> list[Primitive]:
    """``n`` primitives drawn from ``ranges`` (those too large for them are drawn again).

    Args:
        rng: Source of the draws.
        n: Primitives wanted.
        ranges: The sampling ranges.
    """
    out: list[Primitive] = []
    while len(out) < n:
        p = _draw(rng, ranges)
        if _fits(p, ranges):
            out.append(p)
    return out


def neighbours(
    rng: np.random.Generator, p: Primitive, n: int, ranges: SamplingRanges
) -> list[Primitive]:
    """``n`` primitives of ``p``'s kind with sizes near ``p``'s (for adaptive resampling).

    Batch, channels and image side are each scaled by a factor in [0.7, 1.4].

    Args:
        rng: Source of the draws.
        p: The primitive to resample around.
        n: Primitives wanted.
        ranges: The sampling ranges (the same size limits apply).
    """
    out: list[Primitive] = []
    for _ in range(20 * n):
        if len(out) == n:
            break

        def near(v: int, low: int = 1) -> int:
            return max(low, round(v * rng.uniform(0.7, 1.4)))

        c_in = near(p.c_in, 2)
        c_in += c_in % 2 if p.kind in ("add", "cat", "shuffle") else 0
        c_out = c_in if p.depthwise or p.kind not in ("conv", "linear") else near(p.c_out, 2)
        q = dataclasses.replace(
            p,
            batch=near(p.batch),
            c_in=c_in,
            c_out=c_out,
            size=near(p.size, 2) if p.size > 1 else 1,
        )
        if _fits(q, ranges):
            out.append(q)
    return out


def _module(p: Primitive) -> nn.Module:
    if p.kind == "conv":
        groups = p.c_in if p.depthwise else 1
        act = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), "none": nn.Identity()}[p.variant]
        conv = nn.Conv2d(
            p.c_in, p.c_out, p.kernel, p.stride, p.kernel // 2, groups=groups, bias=False
        )
        return nn.Sequential(conv, nn.BatchNorm2d(p.c_out), act)
    if p.kind == "pool":
        if p.variant == "max":
            return nn.MaxPool2d(p.kernel, 2, p.kernel // 2)
        if p.variant == "avg":
            return nn.AvgPool2d(2)
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    if p.kind == "linear":
        return nn.Linear(p.c_in, p.c_out)
    return _Functional(p.kind)


class _Functional(nn.Module):
    """The parameter-free primitives: residual add, concatenation, channel shuffle."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[1] // 2
        a, b = x[:, :half], x[:, half:]
        if self.kind == "add":
            return torch.relu(x + x.detach())
        if self.kind == "cat":
            return torch.cat([x, b], 1)
        n, c, h, w = x.shape
        y = torch.cat([a, b], 1).view(n, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return y.view(n, c, h, w)


def kernel_calls(p: Primitive, mode: str, *, seed: int = 0) -> list[KernelCall]:
    """The ATen calls of one run of primitive ``p``.

    Args:
        p: The primitive.
        mode: ``"inference"`` (forward, ``no_grad``) or ``"training"`` (forward, backward
            with a random output gradient, or a cross-entropy loss for a linear layer, and
            an SGD step with momentum when it has parameters).
        seed: Seed of the inputs and weights.

    Raises:
        PerfmodelError: An unknown mode.
    """
    if mode not in ("inference", "training"):
        raise PerfmodelError(f"kernel_calls: mode={mode!r}, expected inference or training")
    torch.manual_seed(seed)
    module = _module(p)
    shape = (p.batch, p.c_in) if p.kind == "linear" else (p.batch, p.c_in, p.size, p.size)
    x = torch.randn(shape)
    if mode == "inference":
        module.eval()
        with torch.no_grad():
            return capture(lambda: module(x))
    module.train()
    x.requires_grad_(p.input_grad)
    params = list(module.parameters())
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if params else None
    target = torch.randint(0, max(p.c_out, 1), (p.batch,))

    def step() -> None:
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        out = module(x)
        if p.kind == "linear":
            nn.functional.cross_entropy(out, target).backward()
        elif out.requires_grad:
            out.backward(torch.ones_like(out))
        if opt is not None:
            opt.step()

    step()
    return capture(step)


@dataclass(frozen=True)
class KernelSample:
    """One timed kernel.

    Attributes:
        op: The ATen operator.
        family: Its predictor family (``conv``, ``gemm`` or ``generic``).
        features: Its feature values (:func:`~hpcnb.perfmodel.aten.kernel_features`).
        seconds: Minimum over kept rounds of the round medians, seconds per call.
        rounds: The kept rounds' medians.
        primitive: Index of the primitive it came from (in :attr:`KernelProfile.primitives`).
    """

    op: str
    family: str
    features: tuple[float, ...]
    seconds: float
    rounds: tuple[float, ...]
    primitive: int


@dataclass
class KernelProfile:
    """Timed kernel samples and how they were measured.

    Attributes:
        mode: ``"inference"`` or ``"training"``.
        samples: The timed kernels.
        primitives: The primitives they came from.
        protocol: The round-robin settings, threads, clock, machine and torch version.
        seconds_spent: Seconds of measuring in this process (0 when all came from the cache).
        reruns: Slow rounds timed again.
        failed: Operators that could not be replayed alone, with their count.
        loads: 1-minute load average before each round.
    """

    mode: str
    samples: list[KernelSample]
    primitives: list[Primitive]
    protocol: dict[str, Any]
    seconds_spent: float = 0.0
    reruns: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)

    def by_op(self) -> dict[str, list[KernelSample]]:
        """The samples grouped by operator."""
        out: dict[str, list[KernelSample]] = {}
        for s in self.samples:
            out.setdefault(s.op, []).append(s)
        return out


def _digest(data: Any) -> str:
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _protocol(policy: RoundRobinPolicy, threads: int, clock: str) -> dict[str, Any]:
    return {
        "policy": dataclasses.asdict(policy),
        "threads": threads,
        "clock": clock,
        "machine": machine_key(),
        "torch": torch.__version__,
        "reference": REFERENCE,
        "version": KERNEL_CACHE_VERSION,
    }


def _validate(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("version") != KERNEL_CACHE_VERSION:
        raise CorruptCacheError("not a kernel cache of this version")
    for key, e in data["entries"].items():
        if not (isinstance(e["seconds"], float) and e["seconds"] > 0 and isinstance(e["op"], str)):
            raise CorruptCacheError(f"entry {key}: bad seconds or operator")
        e["features"] = [float(v) for v in e["features"]]
    return data


def _select(
    primitives: Sequence[Primitive], mode: str, cap: int, seed: int
) -> tuple[list[tuple[int, KernelCall]], dict[str, int]]:
    """Distinct kernel calls of the primitives, at most ``cap`` per non-convolution op."""
    seen: set[tuple[str, str]] = set()
    count: dict[str, int] = {}
    chosen: list[tuple[int, KernelCall]] = []
    for i, p in enumerate(primitives):
        for call in kernel_calls(p, mode, seed=seed + i):
            family, _ = kernel_features(call)
            if call.key in seen or (family == "generic" and count.get(call.op, 0) >= cap):
                continue
            seen.add(call.key)
            count[call.op] = count.get(call.op, 0) + 1
            chosen.append((i, call))
    return chosen, count


def profile_kernels(
    primitives: Sequence[Primitive],
    mode: str,
    *,
    policy: RoundRobinPolicy | None = None,
    threads: int = 1,
    cap_per_op: int = 150,
    chunk: int = 150,
    seed: int = 0,
    cache: bool | str | Path = True,
    progress: Callable[[Any], Any] | None = None,
) -> KernelProfile:
    """Time every distinct kernel the primitives run, round-robin, with a cache.

    Args:
        primitives: The sampled configurations.
        mode: ``"inference"`` or ``"training"``.
        policy: Round-robin settings (default: 3 rounds, 1 sample of at least 5 ms).
        threads: Threads of torch and BLAS while timing (1: the process CPU clock).
        cap_per_op: Most samples of one non-convolution, non-GEMM operator.
        chunk: Kernels timed together in one round-robin run.
        seed: Seed of weights and inputs.
        cache: ``True`` (this machine's cache folder), a folder, or ``False`` (no cache).
        progress: Wraps the iterable of chunks (a progress bar), or ``None``.

    Raises:
        PerfmodelError: An unknown mode, or chunk / cap below 1.
    """
    if chunk < 1 or cap_per_op < 1:
        raise PerfmodelError(f"profile_kernels: chunk={chunk}, cap_per_op={cap_per_op} (>= 1)")
    policy = policy or KERNEL_POLICY
    clock_name = "cpu" if threads == 1 else "wall"
    protocol = _protocol(policy, threads, clock_name)
    path, entries = cached_entries(cache, "kernels", protocol, _validate)
    chosen, _ = _select(primitives, mode, cap_per_op, seed)
    todo: list[str] = []
    failed: dict[str, int] = {}
    calls: dict[str, tuple[int, KernelCall]] = {}
    for i, call in chosen:
        key = _digest(call.key)
        calls[key] = (i, call)
        if key not in entries:
            todo.append(key)
    profile = KernelProfile(mode, [], list(primitives), protocol, failed=failed)
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    started = time.perf_counter()
    new: dict[str, Any] = {}
    batches = [todo[k : k + chunk] for k in range(0, len(todo), chunk)]
    with pinned_threads(threads, numba=False):
        for batch in progress(batches) if progress else batches:
            runs = {}
            for key in batch:
                try:
                    runs[key] = replay(calls[key][1], seed=seed)
                except PerfmodelError:
                    op = calls[key][1].op
                    failed[op] = failed.get(op, 0) + 1
            if not runs:
                continue
            result = measure_round_robin(runs, reference_kernel(seed), policy, clock=clock)
            profile.reruns += result.reruns
            profile.loads.extend(r.load[0] for r in result.rounds)
            for key in runs:
                call = calls[key][1]
                family, feats = kernel_features(call)
                new[key] = {
                    "op": call.op,
                    "family": family,
                    "features": list(feats),
                    "seconds": float(result.seconds[key]),
                    "rounds": result.round_medians(key),
                }
    profile.seconds_spent = time.perf_counter() - started
    entries.update(new)
    if path is not None and new:
        save_entries(path, protocol, new, _validate)
    for key, (i, _) in calls.items():
        if key in entries:
            e = entries[key]
            profile.samples.append(
                KernelSample(
                    e["op"],
                    e["family"],
                    tuple(e["features"]),
                    e["seconds"],
                    tuple(e.get("rounds", ())),
                    i,
                )
            )
    return profile


def cached_entries(
    cache: bool | str | Path,
    stem: str,
    protocol: dict[str, Any],
    validate: Callable[[Any], Any],
) -> tuple[Path | None, dict[str, Any]]:
    """The cache file of a protocol and its valid entries (none when absent or corrupt).

    The file is ``<stem>-<digest of the protocol>.json`` in this machine's perfmodel cache
    folder (``cache=True``), in the folder ``cache``, or nowhere (``cache=False``).

    Args:
        cache: ``True``, a folder, or ``False``.
        stem: File name stem (``"kernels"``, ``"networks"``).
        protocol: Everything that decides the measurements (hashed into the name).
        validate: Checks the parsed file (:func:`hpcnb.cachefile.read_json`).
    """
    if cache is False:
        return None, {}
    folder = cache_dir("perfmodel") if cache is True else Path(cache)
    path = folder / f"{stem}-{_digest(protocol)}.json"
    stored = read_json(path, validate, what=f"perfmodel {stem} cache") or {}
    return path, dict(stored.get("entries", {}))


def save_entries(
    path: Path, protocol: dict[str, Any], new: dict[str, Any], validate: Callable[[Any], Any]
) -> None:
    """Merge ``new`` entries into the cache file under its lock (a failure warns once).

    Args:
        path: The cache file.
        protocol: Stored beside the entries, with its ``version``.
        new: Key -> entry.
        validate: Checks the file's current content.
    """

    def merge(current: dict[str, Any] | None) -> dict[str, Any]:
        merged = current if current is not None else {"entries": {}}
        merged["entries"].update(new)
        return {
            **merged,
            "version": protocol["version"],
            "protocol": protocol,
            "load": load_average(),
        }

    with best_effort(path, f"perfmodel cache {path.name}"):
        update_json(path, merge, validate=validate)
