"""Measurements and figures for notebook 04: layer timing, metrics tables, Gantt charts.

* :func:`time_layers` — median seconds per layer and of the output head per token for
  batch sizes 1 and ``b`` (timed interleaved through :func:`hpcnb.timing.interleaved`),
  the calibration input of the simulator.
* :func:`paper_scale_cluster` — a 70B-class target over 8 nodes with a ~1B draft, with
  per-layer times scaled from the measured ones by the weight bytes each token reads
  (or set to a GPU-class layer time).
* :func:`paired_ratios` — per-repetition ratios of a metric between two strategies of
  interleaved MPI runs (the samples of a recorded speed-up).
* :func:`relative_error_interval` — a simulator's relative error against measured samples,
  with the interval that the measurement's interval implies (an
  :class:`~hpcnb.stats.Estimate`); :func:`worst_error` — the largest of several.
* :func:`metrics_table` — the per-strategy metrics of MPI runs
  (:class:`~hpcnb.speculative.contracts.RunResult`) as a :class:`pandas.DataFrame`, incl.
  wasted stage work.
* :func:`plot_timeline` — runs across ranks over time (compute, skip, speculative).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from hpcnb.errors import InvalidInputError
from hpcnb.speculative.contracts import RunResult, StageEvent
from hpcnb.speculative.model import LlamaModel
from hpcnb.speculative.simulation import ClusterConfig
from hpcnb.stats import Estimate, median_interval, median_interval_coverage
from hpcnb.timing import interleaved

__all__ = [
    "LAYER_BYTES_70B_Q4",
    "local_cluster",
    "metrics_table",
    "paired_ratios",
    "paper_scale_cluster",
    "plot_timeline",
    "relative_error_interval",
    "simulated_ratios",
    "time_layers",
    "worst_error",
]

LAYER_BYTES_70B_Q4 = 0.86e9 * 0.5
"""Weight bytes of one Llama-2-70B layer (~0.86e9 parameters) in 4-bit weights."""


@torch.no_grad()
def time_layers(model: LlamaModel, batch: int = 5, repeats: int = 9, context: int = 32) -> dict:
    """Measure per-layer and head times of ``model`` after ``context`` cached tokens.

    Args:
        model: The target (its first 4 held layers, embeddings and head are timed).
        batch: Tokens of the batched run (> 1).
        repeats: Timed rounds of every variant, interleaved.
        context: Tokens cached before the timed runs.

    Returns:
        ``layer_s`` (one token, one layer), ``batch_slope`` (extra cost per extra token
        of a ``batch``-token run, as a fraction of one token), ``head_s`` (output head per
        token), ``head_batch_slope`` (the same slope for the output head) and
        ``layer_bytes`` (float32 weight bytes of one layer).
    """
    layers = list(model.layers)
    n = min(4, len(layers))
    sub = model.slice(layers[0], layers[0] + n, embed=True, head=True)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (context + batch,)).tolist()

    def run(b: int) -> None:
        cache = sub.new_cache()
        h = sub.embed(ids[:context])
        sub.run_layers(h, 0, cache)
        sub.run_layers(sub.embed(ids[context : context + b]), 0, cache)

    def prefill_only() -> None:
        sub.run_layers(sub.embed(ids[:context]), 0, sub.new_cache())

    h = torch.randn(1, model.config.dim)
    hb = torch.randn(batch, model.config.dim)
    timings = interleaved(
        [
            prefill_only,
            lambda: run(1),
            lambda: run(batch),
            lambda: sub.logits(h),
            lambda: sub.logits(hb),
        ],
        repeats=repeats,
        warmup=1,
    )
    base, r1, rb, head, head_b = (t.median for t in timings)
    t1 = max(r1 - base, 1e-9) / n
    tb = max(rb - base, 1e-9) / n
    lw = model.layers[layers[0]]
    nbytes = sum(t.numel() * 4 for t in lw.__dict__.values())
    return {
        "layer_s": t1,
        "batch_slope": min(max((tb / t1 - 1.0) / (batch - 1), 0.0), 1.0),
        "head_s": head,
        "head_batch_slope": min(max((head_b / head - 1.0) / (batch - 1), 0.0), 1.0),
        "layer_bytes": float(nbytes),
    }


def paper_scale_cluster(
    measured: dict,
    n_ranks: int = 8,
    bandwidth_bps: float = 125e6,
    latency_s: float = 1e-4,
    *,
    layer_s: float | None = None,
    batch_slope: float | None = None,
) -> ClusterConfig:
    """Return a 70B-class target on ``n_ranks`` nodes with a ~1B draft.

    Stages are taken to be memory-bound: a token's time per layer is the layer's weight
    bytes over the node's memory bandwidth. By default that bandwidth is the one measured
    here (``layer_bytes / layer_s`` of ``measured``: a CPU-class node); ``layer_s`` sets
    the target's per-layer time instead (e.g. tens of microseconds for a GPU-class node)
    and the draft and head scale with the bandwidth it implies. The target is a
    Llama-2-70B shape (80 layers, hidden 8192, :data:`LAYER_BYTES_70B_Q4` per layer, as
    llama.cpp's Q4 files); the draft is a 1.1B model (TinyLlama shape) in 4-bit weights;
    the head is 32000 x 8192.

    Args:
        measured: Output of :func:`time_layers` (``layer_bytes``, ``layer_s``,
            ``batch_slope``).
        n_ranks: Nodes (pipeline stages).
        bandwidth_bps: Link bandwidth in bytes/s.
        latency_s: Per-message link latency in seconds.
        layer_s: Per-layer time of one token of the target (default: from the measured
            memory bandwidth).
        batch_slope: Extra cost per extra token of a batch (default: the measured one,
            capped at 0.5).

    Raises:
        InvalidInputError: ``layer_s`` is not positive.
    """
    if layer_s is None:
        bw = measured["layer_bytes"] / measured["layer_s"]
    elif layer_s > 0:
        bw = LAYER_BYTES_70B_Q4 / layer_s
    else:
        raise InvalidInputError(f"layer_s must be > 0, got {layer_s}")
    slope = min(measured["batch_slope"], 0.5) if batch_slope is None else batch_slope
    return ClusterConfig(
        n_ranks=n_ranks,
        n_layers=80,
        layer_s=LAYER_BYTES_70B_Q4 / bw,
        batch_slope=slope,
        head_s=32000 * 8192 * 0.5 / bw,
        draft_s=1.1e9 * 0.5 / bw,
        latency_s=latency_s,
        bandwidth_bps=bandwidth_bps,
        hidden_bytes=8192 * 4,
    )


def local_cluster(
    measured: dict,
    split: Sequence[Sequence[int]],
    draft_s: float,
    dim: int,
    *,
    latency_s: float = 1e-4,
    bandwidth_bps: float = 5e9,
) -> ClusterConfig:
    """Return the simulator's model of this machine's pipeline: measured stage times.

    Args:
        measured: :func:`time_layers`'s result (layer and head times, batch slopes).
        split: ``(start, end)`` layer slices, one per rank.
        draft_s: Seconds per drafted token.
        dim: Hidden size (the bytes of a message per token are ``4 * dim``).
        latency_s: Message latency between ranks.
        bandwidth_bps: Link bandwidth in bytes per second.
    """
    return ClusterConfig(
        n_ranks=len(split),
        n_layers=int(split[-1][1]),
        layers_per_rank=tuple(int(b) - int(a) for a, b in split),
        layer_s=measured["layer_s"],
        batch_slope=measured["batch_slope"],
        head_s=measured["head_s"],
        draft_s=draft_s,
        latency_s=latency_s,
        bandwidth_bps=bandwidth_bps,
        hidden_bytes=dim * 4,
        head_batch_slope=measured["head_batch_slope"],
    )


def simulated_ratios(
    config: ClusterConfig,
    acceptances: Sequence[float],
    strategies: Mapping[str, Mapping[str, Any]],
    ratios: Sequence[tuple[str, str]],
    *,
    n_new: int,
    prompt_len: int,
    seeds: Sequence[int] = (0, 1, 2),
) -> Any:
    """Simulated tokens/s ratios of strategies, one row per token acceptance.

    Args:
        config: The simulated cluster.
        acceptances: Token acceptance rates of the synthetic draft.
        strategies: Label -> keyword arguments of :func:`~hpcnb.speculative.simulation.simulate`
            (``strategy``, ``k``, ...).
        ratios: ``(numerator, denominator)`` labels; each gives a column
            ``"numerator / denominator"``.
        n_new: Tokens generated per simulated run.
        prompt_len: Prompt tokens.
        seeds: Seeds averaged over (tokens/s is their mean).

    Returns:
        A :class:`pandas.DataFrame` indexed by ``"token acceptance"``.
    """
    from hpcnb.speculative.simulation import simulate

    rows = []
    for p in acceptances:
        tps = {
            label: float(
                np.mean(
                    [
                        simulate(
                            config, acceptance=p, n_new=n_new, prompt_len=prompt_len, seed=s, **kw
                        ).tokens_per_s
                        for s in seeds
                    ]
                )
            )
            for label, kw in strategies.items()
        }
        row: dict[str, float] = {"token acceptance": p}
        row.update({f"{a} / {b}": tps[a] / tps[b] for a, b in ratios})
        rows.append(row)
    return pd.DataFrame(rows).set_index("token acceptance")


def _metric(result: RunResult | Mapping[str, Any], name: str) -> float:
    """A result's metric: an attribute of a result object or a key of a dict."""
    value = result[name] if isinstance(result, Mapping) else getattr(result, name)
    return float(value)


def paired_ratios(
    results: Sequence[RunResult | Mapping[str, Any]],
    labels: Sequence[str],
    numerator: str,
    denominator: str,
    metric: str = "tokens_per_s",
) -> list[float]:
    """Per-repetition ratios ``metric(numerator) / metric(denominator)``.

    The MPI job runs every strategy once per repetition, interleaved, so the i-th run
    labelled ``numerator`` is paired with the i-th run labelled ``denominator``; each
    pair saw the same machine load. Pass the ratios as ``samples`` to
    :func:`hpcnb.record` to get their median with an interval.

    Args:
        results: Results of :func:`hpcnb.speculative.runtime.run_pipeline_mpi` (or
            simulated ones; a dict of metrics also works).
        labels: One label per result.
        numerator: Label of the numerator's runs.
        denominator: Label of the denominator's runs.
        metric: Result field compared (``tokens_per_s``, ``itl_mean_s``, ...).

    Raises:
        InvalidInputError: Lengths differ, a label has no runs, the two labels have different
            numbers of runs, or a denominator value is not positive.
    """
    if len(results) != len(labels):
        raise InvalidInputError(f"{len(results)} results but {len(labels)} labels")
    pairs = list(zip(results, labels, strict=True))
    num = [_metric(r, metric) for r, lab in pairs if lab == numerator]
    den = [_metric(r, metric) for r, lab in pairs if lab == denominator]
    if not num or len(num) != len(den):
        raise InvalidInputError(
            f"need the same, non-zero number of {numerator!r} and {denominator!r} runs, "
            f"got {len(num)} and {len(den)}"
        )
    if any(d <= 0 for d in den):
        raise InvalidInputError(f"a {denominator!r} run has {metric} <= 0; cannot form a ratio")
    return [a / b for a, b in zip(num, den, strict=True)]


def relative_error_interval(predicted: float, samples: Sequence[float]) -> Estimate:
    """Relative error ``|predicted / measured - 1|`` of a prediction against samples.

    ``measured`` is the median of ``samples``; the interval is the range of the error
    over the measurement's order-statistic interval of the median
    (:func:`hpcnb.stats.median_interval`), i.e. the uncertainty of the measurement carried
    into the error (the prediction is taken as exact), with that interval's coverage.

    Args:
        predicted: The prediction (e.g. simulated tokens/s).
        samples: Measurements of the same quantity (positive).

    Returns:
        The error with ``n = len(samples)``; one sample gives no interval.

    Raises:
        InvalidInputError: No samples, or one that is not positive.

    Example:
        >>> e = relative_error_interval(1.2, [0.9, 1.0, 1.1, 1.0, 1.0])
        >>> round(e.value, 6), e.n, round(e.coverage, 4)
        (0.2, 5, 0.9375)
    """
    if not samples or any(x <= 0 for x in samples):
        raise InvalidInputError("relative error needs positive measured samples")
    med = median_interval(samples)
    err = abs(predicted / med.value - 1.0)
    if med.interval is None:
        return Estimate(err, n=med.n)
    lo, hi = med.bounds
    ends = [abs(predicted / hi - 1.0), abs(predicted / lo - 1.0)]
    low = 0.0 if predicted / hi <= 1.0 <= predicted / lo else min(ends)
    coverage = median_interval_coverage(len(samples))[1]
    return Estimate(err, low, max(ends), med.n, coverage)


def worst_error(errors: Sequence[Estimate]) -> Estimate:
    """The largest of several errors, with the interval of the largest.

    When each true error lies in its interval, the largest one lies between the largest
    low end and the largest high end; without an interval on every error there is none.
    ``n`` and the coverage are those of the errors (the smallest coverage when they differ).

    Args:
        errors: Errors of the same kind, e.g. :func:`relative_error_interval` per strategy.

    Raises:
        InvalidInputError: No errors.

    Example:
        >>> worst_error([Estimate(0.1, 0.0, 0.3, 7), Estimate(0.2, 0.1, 0.25, 7)])
        Estimate(value=0.2, low=0.1, high=0.3, n=7, coverage=None)
    """
    if not errors:
        raise InvalidInputError("worst_error needs at least one error")
    value = max(e.value for e in errors)
    ns = {e.n for e in errors}
    n = ns.pop() if len(ns) == 1 else None
    if any(e.interval is None for e in errors):
        return Estimate(value, n=n)
    coverages = [e.coverage for e in errors if e.coverage is not None]
    return Estimate(
        value,
        max(e.bounds[0] for e in errors),
        max(e.bounds[1] for e in errors),
        n,
        min(coverages) if coverages else None,
    )


def metrics_table(results: Sequence[RunResult], labels: Sequence[str] | None = None) -> Any:
    """Return a table of per-strategy metrics (one row per result).

    ``wasted_work`` is the fraction of stage-token computations beyond one per committed
    position and stage (NaN for results without ``useful_positions``, e.g. simulated).

    Args:
        results: Results of MPI runs or simulated ones.
        labels: Row label of each result (default: its strategy).
    """
    rows = []
    for i, r in enumerate(results):
        computed = np.asarray(r.computed, dtype=float)
        skipped = np.asarray(r.skipped, dtype=float)
        useful = getattr(r, "useful_positions", 0) * len(computed)
        rows.append(
            {
                "run": labels[i] if labels else r.strategy,
                "tokens/s": r.tokens_per_s,
                "TTFT (s)": r.ttft_s,
                "ITL mean (ms)": 1e3 * r.itl_mean_s,
                "ITL p90 (ms)": 1e3 * r.itl_p90_s,
                "acceptance": r.acceptance_rate,
                "runs": r.runs,
                "cancelled runs": r.cancelled_runs,
                "skipped stage-tokens": int(skipped.sum()),
                "wasted work": 1.0 - useful / computed.sum() if useful else float("nan"),
            }
        )
    return pd.DataFrame(rows).set_index("run")


def plot_timeline(
    events: Sequence[StageEvent], ax: Any, title: str = "", t_max: float | None = None
) -> None:
    """Draw a Gantt chart of runs across ranks.

    Args:
        events: The stage events, as the MPI runtime and the simulator record them.
        ax: Matplotlib axes.
        title: Axes title.
        t_max: Show only events starting before this time (seconds).
    """
    colours = {"spec": "tab:orange", "plain": "tab:blue", "skip": "tab:red"}
    ranks = sorted({e.rank for e in events})
    for e in events:
        if (t_max is not None and e.t0 > t_max) or e.kind == "draft":
            continue
        skip = e.kind == "skip"
        c = colours["skip"] if skip else colours["spec" if e.speculative else "plain"]
        span = e.t1 - e.t0
        width = max(span, (t_max or 1.0) * 2e-3) if skip else span
        ax.barh(e.rank, width * 1e3, left=e.t0 * 1e3, color=c, edgecolor="k", linewidth=0.3)
        if span > 0 and (t_max is None or span > 0.03 * t_max):
            ax.text(
                (e.t0 + e.t1) / 2 * 1e3,
                e.rank,
                str(e.run_id % 1_000_000),
                ha="center",
                va="center",
                fontsize=6,
            )
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=colours["plain"], label="non-speculative run"),
            Patch(color=colours["spec"], label="speculative run"),
            Patch(color=colours["skip"], label="cancelled (skipped)"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
    )
