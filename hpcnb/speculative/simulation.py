"""Discrete-event simulation of the three strategies on a cluster of pipeline stages.

The simulator drives the very :class:`HeadPolicy` the MPI runtime uses, so launch,
verification and cancellation decisions are identical; only time and tokens are
synthetic. The target's greedy output is a fixed sequence; a synthetic draft guesses
each next token correctly with probability ``acceptance`` (independently per token).

Costs (all in seconds): a stage running ``L`` layers on a batch of ``b`` tokens takes
``L * layer_s * (1 + batch_slope * (b - 1))``; the last stage adds the output head
``head_s * b`` (or ``head_s * (1 + head_batch_slope * (b - 1))`` when the head's batch cost
was measured); the head rank pays ``draft_s`` per drafted token before running its
stage. A hop of ``b`` tokens' hidden states takes ``latency_s + b * hidden_bytes /
bandwidth_bps``; results and cancel messages take ``latency_s``. Each link sends one
message at a time, in order — MPI's non-overtaking rule, which the head's verification
relies on (results arrive in launch order): a message occupies its link for its bytes
over the bandwidth, after the link's previous message. Cancel messages go to the last
stage and travel backwards one hop at a time; a stage skips a run whose cancel arrived
before the run's turn (a placeholder continues at no cost).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from hpcnb.errors import InvalidInputError, InvalidStateError
from hpcnb.speculative.contracts import RunResult, StageEvent
from hpcnb.speculative.head import HeadPolicy, Run

__all__ = ["ClusterConfig", "SyntheticDraft", "simulate", "sweep"]


@dataclass(frozen=True)
class ClusterConfig:
    """A simulated cluster and model.

    Attributes:
        n_ranks: Pipeline stages (nodes).
        n_layers: Target layers, split evenly over the stages.
        layer_s: Seconds per layer for one token.
        batch_slope: Extra cost per extra token in a batch, as a fraction of one token.
        head_s: Seconds of the output head per token (last stage).
        draft_s: Seconds of the draft per drafted token (head rank).
        latency_s: Per-message latency of a hop.
        bandwidth_bps: Link bandwidth in bytes/s.
        hidden_bytes: Bytes of one token's hidden state.
        layers_per_rank: Layers of each stage (default: an even split).
        head_batch_slope: Extra cost of the output head per extra token of a batch, as a
            fraction of one token (``None``: the head costs ``head_s`` per token).
        run_overhead_s: Fixed seconds every stage spends on every run it computes
            (message handling, interpreter), on top of its layers.
    """

    n_ranks: int = 2
    n_layers: int = 30
    layer_s: float = 1e-3
    batch_slope: float = 0.15
    head_s: float = 5e-3
    draft_s: float = 1e-3
    latency_s: float = 50e-6
    bandwidth_bps: float = 125e6
    hidden_bytes: int = 576 * 4
    layers_per_rank: tuple[int, ...] | None = None
    head_batch_slope: float | None = None
    run_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        """Check the values.

        Raises:
            InvalidInputError: Fewer than 2 stages or more stages than layers, a negative
                time or slope, a bandwidth that is not positive, or ``layers_per_rank``
                that does not split the layers over the stages.
        """
        if self.n_ranks < 2 or self.n_layers < self.n_ranks:
            raise InvalidInputError(
                f"need 2 <= n_ranks <= n_layers, got n_ranks={self.n_ranks}, "
                f"n_layers={self.n_layers}"
            )
        for name in ("layer_s", "head_s", "draft_s", "latency_s", "batch_slope", "run_overhead_s"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"ClusterConfig.{name} must be >= 0")
        if self.bandwidth_bps <= 0:
            raise InvalidInputError("ClusterConfig.bandwidth_bps must be > 0")
        lpr = self.layers_per_rank
        if lpr is not None and (len(lpr) != self.n_ranks or sum(lpr) != self.n_layers):
            raise InvalidInputError(
                f"layers_per_rank={lpr} must give {self.n_ranks} counts summing to {self.n_layers}"
            )

    def stage_s(self, rank: int, b: int) -> float:
        """Seconds for stage ``rank`` to run a batch of ``b`` tokens.

        Args:
            rank: The stage (the last one also runs the output head).
            b: Tokens of the batch.
        """
        if self.layers_per_rank is not None:
            n = self.layers_per_rank[rank]
        else:
            n = (rank + 1) * self.n_layers // self.n_ranks - rank * self.n_layers // self.n_ranks
        t = self.run_overhead_s + n * self.layer_s * (1.0 + self.batch_slope * (b - 1))
        if rank == self.n_ranks - 1:
            if self.head_batch_slope is None:
                t += self.head_s * b
            else:
                t += self.head_s * (1.0 + self.head_batch_slope * (b - 1))
        return t

    def hop_s(self, b: int) -> float:
        """Seconds to send ``b`` tokens' hidden states one hop."""
        return self.latency_s + b * self.hidden_bytes / self.bandwidth_bps


@dataclass
class SyntheticDraft:
    """Guesses the true next token with probability ``acceptance``.

    Args:
        truth: The target's greedy sequence (prompt first).
        acceptance: Chance that each guess is right (independently per token).
        seed: Seed of the guesses.
        name: Label.
    """

    truth: list[int]
    acceptance: float
    seed: int = 0
    name: str = "synthetic"
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        """Seed the generator."""
        self.rng = random.Random(self.seed)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return ``k`` guesses; each is right with probability ``acceptance``.

        Args:
            context: Tokens so far (only their number matters).
            k: Guesses wanted (fewer at the end of ``truth``).
        """
        n = len(context)
        out = []
        for i in range(n, min(n + k, len(self.truth))):
            ok = self.rng.random() < self.acceptance
            out.append(self.truth[i] if ok else -1 - self.rng.randrange(1000))
        return out


class _Hop(NamedTuple):
    """A run's hidden states on their way into a stage (``live``: not cancelled before)."""

    run: Run
    live: bool


class _Result(NamedTuple):
    """The last stage's argmax tokens of a run (``None``: a cancelled run's placeholder)."""

    run: Run
    out: list[int] | None


class _EventLoop:
    """One simulated generation: the event heap, the stages' queues, links and counters.

    Events are ``(time, counter, kind, data)`` on a heap; the counter keeps events of equal
    time in the order they were pushed. Each kind has its step: ``head`` (the head takes
    the results that arrived and launches the next run), ``head_done`` (the head's stage
    finished a run and sends it), ``arrive`` / ``start`` / ``done`` (a stage queues, runs
    or skips, and passes on a run) and ``result`` (the last stage's tokens reach the head).

    Args:
        cluster: The cluster and model.
        policy: The head's policy, before its first run.
        truth: The target's greedy sequence (prompt first).
    """

    def __init__(self, cluster: ClusterConfig, policy: HeadPolicy, truth: list[int]) -> None:
        n = cluster.n_ranks
        self.cluster, self.policy, self.truth = cluster, policy, truth
        self.heap: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self.counter = 0
        self.queues: list[list[_Hop]] = [[] for _ in range(n)]
        self.busy = [False] * n
        self.cancel_at: list[dict[int, float]] = [{} for _ in range(n)]
        self.inbox: list[_Result] = []
        self.link_free = [0.0] * n  # when the link into stage j has sent its last message
        self.computed, self.skipped = [0] * n, [0] * n
        self.events: list[StageEvent] = []
        self.head_busy = False

    def push(self, t: float, kind: str, *data: Any) -> None:
        """Schedule an event of ``kind`` at time ``t``.

        Args:
            t: Its time in seconds.
            kind: The step that handles it.
            *data: What the step receives after the time.
        """
        heapq.heappush(self.heap, (t, self.counter, kind, data))
        self.counter += 1

    def run(self) -> float:
        """Process events until every token is committed; return that time (0: never)."""
        steps: dict[str, Callable[..., float | None]] = {
            "head": self.head,
            "head_done": self.head_done,
            "arrive": self.arrive,
            "start": self.start,
            "done": self.done,
            "result": self.result,
        }
        self.push(0.0, "head")
        while self.heap:
            now, _, kind, data = heapq.heappop(self.heap)
            end = steps[kind](now, *data)
            if end is not None:
                return end
        return 0.0

    def send(self, now: float, j: int, n_tokens: int) -> float:
        """Arrival time at stage ``j`` of ``n_tokens`` hidden states sent now (FIFO link)."""
        start = max(now, self.link_free[j])
        self.link_free[j] = (
            start + n_tokens * self.cluster.hidden_bytes / self.cluster.bandwidth_bps
        )
        return self.link_free[j] + self.cluster.latency_s

    def outputs(self, run: Run) -> list[int]:
        """The target's argmax after each of the run's tokens (``-7`` after a wrong prefix)."""
        truth = self.truth
        out = []
        for i in range(len(run.tokens)):
            q = run.parent_len + i
            ok = run.assumed[: q + 1] == truth[: q + 1]
            out.append(truth[q + 1] if ok else -7)
        return out

    def take_results(self, now: float) -> None:
        """Verify the results that reached the head; time the cancel messages they cause."""
        p, latency = self.cluster.n_ranks, self.cluster.latency_s
        while self.inbox:
            msg = self.inbox.pop(0)
            _, cancels = self.policy.on_result(msg.run.run_id, msg.out, now)
            for rid in cancels:
                for j in range(1, p):
                    self.cancel_at[j][rid] = now + (p - j) * latency

    def launch(self, now: float) -> None:
        """Launch the policy's next run, if any: draft it and run the head's stage."""
        pol, cl = self.policy, self.cluster
        run = None if pol.done else pol.next_run()
        if run is None:
            return
        n = len(run.tokens)
        chained = run.parent_seq != 0
        n_draft = n if chained else len(run.assumed) - len(pol.committed)
        t_draft = cl.draft_s * n_draft if run.speculative else 0.0
        dur = t_draft + cl.stage_s(0, n)
        self.computed[0] += n
        self.events.append(StageEvent(0, run.run_id, "compute", now, now + dur, n, run.speculative))
        self.head_busy = True
        self.push(now + dur, "head_done", run)

    def head(self, now: float) -> float | None:
        """The head's turn: take results, stop when done, else launch; the end time or None."""
        if self.head_busy:
            return None
        self.take_results(now)
        if self.policy.done and not self.policy.inflight:
            return now
        self.launch(now)
        return None

    def head_done(self, now: float, run: Run) -> None:
        """The head's stage finished ``run``: send it to stage 1, the head is free."""
        self.head_busy = False
        self.push(self.send(now, 1, len(run.tokens)), "arrive", 1, _Hop(run, True))
        self.push(now, "head")

    def arrive(self, now: float, j: int, msg: _Hop) -> None:
        """A run reaches stage ``j``: queue it."""
        self.queues[j].append(msg)
        self.push(now, "start", j)

    def start(self, now: float, j: int) -> None:
        """Stage ``j`` takes its next run when idle: computes it, or skips a cancelled one."""
        if self.busy[j] or not self.queues[j]:
            return
        msg = self.queues[j].pop(0)
        run, n = msg.run, len(msg.run.tokens)
        live = msg.live and self.cancel_at[j].get(run.run_id, np.inf) > now
        dur = self.cluster.stage_s(j, n) if live else 0.0
        if live:
            self.computed[j] += n
        else:
            self.skipped[j] += n
        what = "compute" if live else "skip"
        self.events.append(StageEvent(j, run.run_id, what, now, now + dur, n, run.speculative))
        self.busy[j] = True
        self.push(now + dur, "done", j, _Hop(run, live))

    def done(self, now: float, j: int, msg: _Hop) -> None:
        """Stage ``j`` finished a run: the last stage returns its tokens, others pass it on."""
        self.busy[j] = False
        if j == self.cluster.n_ranks - 1:
            out = self.outputs(msg.run) if msg.live else None
            self.push(now + self.cluster.latency_s, "result", _Result(msg.run, out))
        else:
            n_sent = len(msg.run.tokens) if msg.live else 0  # placeholder: no states
            self.push(self.send(now, j + 1, n_sent), "arrive", j + 1, msg)
        self.push(now, "start", j)

    def result(self, now: float, msg: _Result) -> None:
        """A result reaches the head's inbox."""
        self.inbox.append(msg)
        self.push(now, "head")


def simulate(
    cluster: ClusterConfig,
    strategy: str,
    acceptance: float,
    n_new: int = 128,
    prompt_len: int = 16,
    k: int = 4,
    max_inflight: int = 4,
    max_ahead: int = 12,
    seed: int = 0,
    plain_drafts: bool = False,
    adaptive: bool = False,
) -> RunResult:
    """Simulate one generation of ``n_new`` tokens and return its metrics and events.

    Args:
        cluster: The cluster and model.
        strategy: ``"pipeline"``, ``"speculative"`` or ``"pipeinfer"``.
        acceptance: Chance that each draft token is right (:class:`SyntheticDraft`).
        n_new: Tokens to generate.
        prompt_len: Tokens of the synthetic prompt.
        k: Most draft tokens per speculative run.
        max_inflight: Most runs in flight (``pipeinfer``).
        max_ahead: Most unverified tokens beyond the committed ones (``pipeinfer``).
        seed: Seed of the draft's guesses.
        plain_drafts: ``pipeinfer``: the run from the committed tokens also drafts.
        adaptive: Adapt the draft length and runs in flight to the acceptance so far.

    Returns:
        The generation's :class:`~hpcnb.speculative.contracts.RunResult` (simulated times).

    Raises:
        InvalidStateError: The generated tokens differ from the target's (a policy error).
    """
    truth = list(range(1000, 1000 + prompt_len + n_new + 64))
    prompt = truth[:prompt_len]
    draft = SyntheticDraft(truth, acceptance, seed) if strategy != "pipeline" else None
    pol = HeadPolicy(
        strategy,
        prompt,
        n_new,
        draft,
        k,
        max_inflight,
        max_ahead,
        plain_drafts=plain_drafts,
        adaptive=adaptive,
    )
    loop = _EventLoop(cluster, pol, truth)
    end = loop.run()
    if pol.generated() != truth[prompt_len : prompt_len + n_new]:
        raise InvalidStateError(f"simulated {strategy} run was not lossless (policy error)")
    return RunResult.from_policy(
        pol,
        ranks=cluster.n_ranks,
        elapsed_s=end,
        computed=loop.computed,
        skipped=loop.skipped,
        events=loop.events,
    )


class _Best(NamedTuple):
    """The best setting of a strategy (ordered by tokens/s, then ``k``, then latency)."""

    tokens_per_s: float
    k: int
    itl_mean_s: float


def sweep(
    cluster: ClusterConfig,
    acceptances: list[float],
    *,
    n_new: int = 128,
    ks: tuple[int, ...] = (1, 2, 4, 8),
    pipeinfer_ks: tuple[int, ...] = (1, 2, 4),
    inflights: tuple[int, ...] | None = None,
    plain_drafts: bool = False,
    adaptive: bool = False,
    seeds: tuple[int, ...] = (0,),
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Tokens/s of the three strategies over acceptance rates (best ``k`` per strategy).

    Args:
        cluster: Base cluster; ``overrides`` replace its fields (e.g. ``n_ranks=8``).
        acceptances: Draft acceptance rates to simulate.
        n_new: Generated tokens.
        ks: Draft lengths tried for standard speculation (the best is kept).
        pipeinfer_ks: Tokens per speculative run tried for PipeInfer (the best is kept).
        inflights: PipeInfer in-flight limits tried (default ``(4, n_ranks, 2 * n_ranks)``).
        plain_drafts: PipeInfer variant (see :class:`HeadPolicy`).
        adaptive: Adaptive draft length and runs in flight (see :class:`HeadPolicy`).
        seeds: Acceptance traces averaged over.
        **overrides: :class:`ClusterConfig` fields to replace.

    Returns:
        One row per acceptance rate: tokens/s per strategy, the ratios, the chosen ``k``
        and mean inter-token latencies.
    """
    cl = replace(cluster, **overrides)
    limits = tuple(sorted(set(inflights or (4, cl.n_ranks, 2 * cl.n_ranks))))
    rows = []
    for a in acceptances:

        def best(strategy: str, kset: tuple[int, ...], mis: tuple[int, ...], a: float = a) -> _Best:
            out = []
            for kk in kset:
                for mi in mis:
                    res = [
                        simulate(
                            cl,
                            strategy,
                            a,
                            n_new,
                            k=kk,
                            max_inflight=mi,
                            seed=s,
                            plain_drafts=plain_drafts,
                            adaptive=adaptive,
                        )
                        for s in seeds
                    ]
                    tps = float(np.mean([r.tokens_per_s for r in res]))
                    itl = float(np.mean([r.itl_mean_s for r in res]))
                    out.append(_Best(tps, kk, itl))
            return max(out)

        pipe = simulate(cl, "pipeline", a, n_new)
        spec = best("speculative", ks, (1,))
        pinf = best("pipeinfer", pipeinfer_ks, limits)
        rows.append(
            {
                "acceptance": a,
                "n_ranks": cl.n_ranks,
                "bandwidth_bps": cl.bandwidth_bps,
                "pipeline_tps": pipe.tokens_per_s,
                "speculative_tps": spec.tokens_per_s,
                "pipeinfer_tps": pinf.tokens_per_s,
                "speculative_k": spec.k,
                "pipeinfer_k": pinf.k,
                "pipeinfer_vs_speculative": pinf.tokens_per_s / spec.tokens_per_s,
                "pipeinfer_vs_pipeline": pinf.tokens_per_s / pipe.tokens_per_s,
                "itl_pipeline_s": pipe.itl_mean_s,
                "itl_speculative_s": spec.itl_mean_s,
                "itl_pipeinfer_s": pinf.itl_mean_s,
            }
        )
    return rows
