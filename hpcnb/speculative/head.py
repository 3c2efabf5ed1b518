"""The head's decision logic: which run to launch, what to accept, what to cancel.

One policy serves the three strategies, the MPI runtime and the discrete-event simulator:

``pipeline``
    Plain pipeline-parallel autoregressive decoding: one single-token run in flight.
``speculative``
    Standard synchronous speculation: draft up to ``k`` tokens, send them (after the last
    committed token) through the pipeline as one batch, wait, verify, repeat.
``pipeinfer``
    Continuous asynchronous speculation: whenever no result is waiting and fewer than
    ``max_inflight`` runs are in flight, launch another small speculative run chained on the
    newest live run's (still unverified) tokens; a non-speculative single-token run is
    launched whenever no live run covers the next position. When a result invalidates
    runs still in flight they are cancelled (early inference cancellation).

``adaptive`` (speculative and pipeinfer)
    The draft length and, for PipeInfer, the runs in flight follow the acceptance seen so
    far. The head keeps ``p``, an exponential moving average (weight
    :data:`ADAPT_ALPHA` per judged token, starting at :data:`ADAPT_PRIOR`) of whether each
    draft token whose position has been verified was right (tokens after a rejection in
    the same draft are never judged). A draft that starts ``a`` unverified tokens beyond
    the committed ones has ``k = max{i <= k_max : p**(a + i) >=`` :data:`ADAPT_MIN_GAIN`
    ``}`` tokens (``p**(a + i)`` is the chance that its ``i``-th token is accepted, i.e.
    its expected gain in tokens). For standard speculation ``a = 0``; for PipeInfer a run
    chained on runs in flight has ``a`` = their unverified tokens, so the number of runs
    in flight follows ``p`` too (up to ``max_inflight``): with ``p = 0.5`` a chain stops
    two draft tokens ahead, with ``p = 0.9`` fifteen. When ``k`` is 0 the head
    decodes as the plain pipeline does and, to notice a draft that improves, lets one
    draft token ride along after :data:`ADAPT_PROBE_EVERY` runs without one; each
    rejected probe doubles that wait (up to :data:`ADAPT_PROBE_MAX`), an accepted draft
    token resets it. With a draft that is never right, ``p`` falls below the threshold
    after two judged tokens (2 + 1 drafted tokens), then probes come after 8, 16, 32,
    64, 64, ... runs.

A *run* evaluates ``tokens`` at positions ``parent_len, parent_len + 1, ...`` in its own
KV-cache sequence ``seq``, whose first ``parent_len`` positions are copied from
``parent_seq`` (sequence 0 holds the committed tokens, or the parent is an earlier
in-flight run). ``assumed`` is the token sequence the run presumes. Verification is
greedy exact match: output ``i`` (the target's argmax after ``assumed[:parent_len+i+1]``)
is trusted when that prefix equals the committed tokens, and appended when it extends
them. Cache edits produced here (``("commit", seq, length)`` = make sequence 0 the first
``length`` positions of ``seq``; ``("remove", seq)``) must reach every stage in order with
the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hpcnb.errors import InvalidInputError, UnknownNameError

__all__ = [
    "ADAPT_ALPHA",
    "ADAPT_MIN_GAIN",
    "ADAPT_PRIOR",
    "ADAPT_PROBE_EVERY",
    "ADAPT_PROBE_MAX",
    "STRATEGIES",
    "Draft",
    "Edit",
    "HeadPolicy",
    "Run",
    "RunHeader",
    "draft_length",
    "lcp",
]

STRATEGIES = ("pipeline", "speculative", "pipeinfer")
ADAPT_PRIOR = 0.5
"""Acceptance assumed before any draft token is judged."""
ADAPT_ALPHA = 0.4
"""Weight of each judged draft token in the moving average of acceptance."""
ADAPT_MIN_GAIN = 0.2
"""Draft another token while the chance that it is accepted is at least this."""
ADAPT_PROBE_EVERY = 8
"""With drafting switched off, one draft token rides along after this many runs without."""
ADAPT_PROBE_MAX = 64
"""Longest wait between probes (each rejected probe doubles the wait, up to this)."""
Edit = tuple[str | int, ...]
"""A cache edit: ``("commit", seq, length)`` or ``("remove", seq)``."""


class Draft(Protocol):
    """What the head needs from a draft: up to ``k`` guesses continuing ``context``."""

    name: str

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return up to ``k`` draft tokens (possibly none) continuing ``context``.

        Args:
            context: Tokens so far (prompt and committed or assumed ones).
            k: Most tokens to propose.
        """
        ...


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Return the length of the longest common prefix of ``a`` and ``b``.

    Args:
        a: A token sequence.
        b: Another token sequence.

    >>> lcp([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def draft_length(p: float, k_max: int, ahead: int = 0, min_gain: float = ADAPT_MIN_GAIN) -> int:
    """Return the adaptive draft length: most ``i <= k_max`` with ``p**(ahead + i) >= min_gain``.

    Args:
        p: Estimated chance that a draft token is right.
        k_max: Most draft tokens.
        ahead: Unverified tokens the draft starts beyond the committed ones.
        min_gain: Least chance of acceptance worth drafting a token for.

    >>> [draft_length(p, 4) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    [0, 1, 2, 4, 4]
    >>> draft_length(0.7, 4, ahead=3), draft_length(0.7, 4, ahead=4)
    (1, 0)
    """
    k = 0
    while k < k_max and p ** (ahead + k + 1) >= min_gain:
        k += 1
    return k


@dataclass(frozen=True)
class RunHeader:
    """What the stages need to know about a run (no token history).

    Attributes:
        run_id: The run.
        seq: Its KV-cache sequence.
        parent_seq: Sequence whose first ``parent_len`` positions it starts from.
        parent_len: Positions copied from ``parent_seq``.
        tokens: Tokens to evaluate, at positions ``parent_len, parent_len + 1, ...``.
        speculative: Whether the run carries draft tokens.
    """

    run_id: int
    seq: int
    parent_seq: int
    parent_len: int
    tokens: tuple[int, ...]
    speculative: bool


@dataclass
class Run:
    """One batch of tokens travelling through the pipeline."""

    run_id: int
    seq: int
    parent_seq: int
    parent_len: int
    tokens: list[int]
    assumed: list[int]
    speculative: bool
    cancelled: bool = False

    def header(self) -> RunHeader:
        """Return what the stages need to know about the run (no token history)."""
        return RunHeader(
            self.run_id,
            self.seq,
            self.parent_seq,
            self.parent_len,
            tuple(self.tokens),
            self.speculative,
        )


@dataclass
class HeadPolicy:
    """Launch / verify / cancel decisions of the head rank.

    Args:
        strategy: One of :data:`STRATEGIES`.
        prompt: Prompt token ids.
        n_new: Tokens to generate.
        draft: Draft model (unused by ``pipeline``).
        k: Most tokens per speculative run.
        max_inflight: Most runs in flight (``pipeinfer``).
        max_ahead: Most unverified tokens beyond the committed ones (``pipeinfer``).
        first_run_id: Id of the first run (ids stay unique across generations of one job).
        plain_drafts: ``pipeinfer`` only: the run that starts from the committed tokens
            also carries draft tokens (``False``: it is a single non-speculative token, as
            in the paper's description).
        adaptive: Adapt the draft length (at most ``k``) and the runs in flight (at most
            ``max_inflight``) to the acceptance seen so far (the rule in the module
            docstring).
    """

    strategy: str
    prompt: list[int]
    n_new: int
    draft: Draft | None = None
    k: int = 4
    max_inflight: int = 4
    max_ahead: int = 12
    first_run_id: int = 0
    plain_drafts: bool = False
    adaptive: bool = False
    committed: list[int] = field(default_factory=list)
    inflight: dict[int, Run] = field(default_factory=dict)
    seq0_len: int = 0
    n_runs: int = 0
    n_cancelled: int = 0
    drafted: int = 0
    accepted: int = 0
    commit_times: list[float] = field(default_factory=list)
    acceptance_estimate: float = ADAPT_PRIOR  # moving average of judged draft tokens
    k_history: list[int] = field(default_factory=list)
    _next_seq: int = 1
    _guess: dict[int, tuple[int, int]] = field(default_factory=dict)
    _since_probe: int = 0
    _probe_wait: int = ADAPT_PROBE_EVERY

    def __post_init__(self) -> None:
        """Validate the settings and start from the prompt.

        Raises:
            InvalidInputError: An unknown strategy, an empty prompt, a count below 1, or
                a speculative strategy without a draft.
        """
        if self.strategy not in STRATEGIES:
            raise InvalidInputError(f"strategy={self.strategy!r}; expected one of {STRATEGIES}")
        if not self.prompt:
            raise InvalidInputError("prompt must hold at least one token")
        if self.n_new < 1 or self.k < 1 or self.max_inflight < 1:
            raise InvalidInputError("n_new, k and max_inflight must be >= 1")
        if self.strategy != "pipeline" and self.draft is None:
            raise InvalidInputError(f"strategy {self.strategy!r} needs a draft")
        self.committed = list(self.prompt)

    # -- state ----------------------------------------------------------------------------

    @property
    def target_len(self) -> int:
        """Length of prompt plus generated tokens at the end."""
        return len(self.prompt) + self.n_new

    @property
    def done(self) -> bool:
        """Whether all tokens are committed."""
        return len(self.committed) >= self.target_len

    def generated(self) -> list[int]:
        """Return the generated tokens."""
        return self.committed[len(self.prompt) : self.target_len]

    def _live(self) -> list[Run]:
        c = self.committed
        return [
            r
            for r in self.inflight.values()
            if not r.cancelled and lcp(r.assumed, c) == min(len(r.assumed), len(c))
        ]

    # -- launching ------------------------------------------------------------------------

    def _new_run(self, parent_seq: int, parent_len: int, assumed: list[int], spec: bool) -> Run:
        run = Run(
            run_id=self.first_run_id + self.n_runs,
            seq=self._next_seq,
            parent_seq=parent_seq,
            parent_len=parent_len,
            tokens=assumed[parent_len:],
            assumed=assumed,
            speculative=spec,
        )
        self.n_runs += 1
        self._next_seq += 1
        self.inflight[run.run_id] = run
        self._since_probe = 0 if spec else self._since_probe + 1
        self.k_history.append(len(assumed) - max(len(self.committed), parent_len) if spec else 0)
        return run

    def _propose(self, context: list[int], k: int) -> list[int]:
        if self.draft is None or k <= 0:
            return []
        room = self.target_len - len(context)
        d = [int(t) for t in self.draft.propose(context, min(k, max(room, 0)))][:k]
        self.drafted += len(d)
        owner = self.first_run_id + self.n_runs  # the run about to be launched
        for j, t in enumerate(d):
            self._guess[len(context) + j] = (t, owner)
        return d

    def _probe_due(self) -> bool:
        return self._since_probe >= self._probe_wait

    def draft_len(self, ahead: int = 0) -> int:
        """Return the most draft tokens of a run starting ``ahead`` unverified tokens out.

        ``k`` unless adaptive; see the module docstring for the rule.
        """
        if not self.adaptive:
            return self.k
        k = draft_length(self.acceptance_estimate, self.k, ahead)
        return 1 if k == 0 and ahead == 0 and self._probe_due() else k

    def next_run(self) -> Run | None:
        """Return the next run to launch now, or ``None`` to wait for a result."""
        if self.done:
            return None
        c = self.committed
        if self.strategy in ("pipeline", "speculative"):
            if self.inflight:
                return None
            d = self._propose(c, self.draft_len()) if self.strategy == "speculative" else []
            return self._new_run(0, self.seq0_len, c + d, bool(d))
        # pipeinfer
        if len(self.inflight) >= self.max_inflight:
            return None
        live = [r for r in self._live() if len(r.assumed) >= len(c)]
        if not live:
            d = self._propose(c, self.draft_len()) if self.plain_drafts else []
            return self._new_run(0, self.seq0_len, c + d, bool(d))
        tip = max(live, key=lambda r: (len(r.assumed), r.run_id))
        ahead = len(tip.assumed) - len(c)
        room = min(self.draft_len(ahead), self.max_ahead - ahead)
        d = self._propose(tip.assumed, room)
        if not d:
            return None
        return self._new_run(tip.seq, len(tip.assumed), tip.assumed + d, True)

    # -- results --------------------------------------------------------------------------

    def on_result(
        self,
        run_id: int,
        outputs: Sequence[int] | None,
        now: float = 0.0,
        *,
        features: Any = None,
        start: int | None = None,
    ) -> tuple[list[Edit], list[int]]:
        """Verify a run's outputs; return cache edits and newly cancelled run ids.

        When the result carries the target's final hidden states (``features``), those of
        positions whose assumed tokens are now committed go to the draft's ``observe``.

        Args:
            run_id: The run whose result arrived (results arrive in launch order).
            outputs: The target's argmax after each of the run's tokens, or ``None`` for a
                cancelled run's placeholder.
            now: Time stamp of the commit (for inter-token latency).
            features: ``(len(tokens), dim)`` final hidden states of the run's positions,
                or ``None``.
            start: Position of the first of them (must be the run's first position).

        Raises:
            UnknownNameError: ``run_id`` is not in flight.
            InvalidInputError: An older run is still in flight (results out of launch
                order), the outputs do not match the run's tokens, or the features do not
                match the run's positions.
        """
        if run_id not in self.inflight:
            raise UnknownNameError(f"result for unknown run {run_id}")
        oldest = next(iter(self.inflight))
        if run_id != oldest:  # verification needs results in launch order (MPI non-overtaking)
            raise InvalidInputError(f"result for run {run_id} arrived before that of run {oldest}")
        run = self.inflight[run_id]
        if features is not None:
            shape = tuple(getattr(features, "shape", ()))
            if len(shape) != 2 or shape[0] != len(run.tokens) or start != run.parent_len:
                raise InvalidInputError(
                    f"run {run_id}: features of shape {shape} from position {start}; expected "
                    f"({len(run.tokens)}, dim) from position {run.parent_len}"
                )
        del self.inflight[run_id]
        edits: list[Edit] = []
        if outputs is not None and not run.cancelled:
            if len(outputs) != len(run.tokens):
                raise InvalidInputError(
                    f"run {run_id}: {len(outputs)} outputs for {len(run.tokens)} tokens"
                )
            c = self.committed
            before = len(c)
            for i, y in enumerate(outputs):
                q = run.parent_len + i
                if q + 1 > len(c) or run.assumed[q] != c[q] or lcp(run.assumed[: q + 1], c) < q + 1:
                    break
                if q + 1 == len(c) and len(c) < self.target_len:
                    guess = self._guess.pop(len(c), None)
                    if guess is not None:
                        self._judge(guess[0] == int(y))
                    c.append(int(y))
            gained = len(c) - before
            self.commit_times.extend([now] * gained)
            keep = min(len(run.assumed), lcp(run.assumed, c))
            if keep > self.seq0_len:
                edits.append(("commit", run.seq, keep))
                self.seq0_len = keep
        edits.append(("remove", run.seq))
        cancels = []
        c = self.committed
        for r in self.inflight.values():
            if not r.cancelled and lcp(r.assumed, c) < min(len(r.assumed), len(c)):
                r.cancelled = True
                cancels.append(r.run_id)
        if self.done:
            for r in self.inflight.values():
                if not r.cancelled:
                    r.cancelled = True
                    cancels.append(r.run_id)
        self.n_cancelled += len(cancels)
        dead = {run.run_id, *cancels}  # their guesses beyond the committed tokens are void
        n = len(self.committed)
        self._guess = {q: g for q, g in self._guess.items() if q >= n and g[1] not in dead}
        observe = getattr(self.draft, "observe", None)
        if features is not None and outputs is not None and not run.cancelled and observe:
            # features of positions whose assumed prefix is committed hold for the committed text
            m = min(len(run.tokens), lcp(run.assumed, self.committed) - run.parent_len)
            if m > 0:
                observe(list(self.committed), run.parent_len, features[:m])
        return edits, cancels

    def _judge(self, accepted: bool) -> None:
        """Count a verified draft token and update the moving average of acceptance."""
        self.accepted += int(accepted)
        if accepted:
            self._probe_wait = ADAPT_PROBE_EVERY
        elif draft_length(self.acceptance_estimate, self.k) == 0:  # a rejected probe
            self._probe_wait = min(2 * self._probe_wait, ADAPT_PROBE_MAX)
        self.acceptance_estimate += ADAPT_ALPHA * (float(accepted) - self.acceptance_estimate)

    def latencies(self, t_start: float = 0.0) -> tuple[float, float, float]:
        """Return ``(ttft_s, itl_mean_s, itl_p90_s)`` of the committed tokens.

        Time to the first generated token (from ``t_start``), mean inter-token latency and
        the 90th percentile of the gaps between commits.

        Args:
            t_start: Time of the first launch on the clock of ``commit_times``.
        """
        times = np.asarray(self.commit_times[: self.n_new]) - t_start
        gaps = np.diff(times) if len(times) > 1 else np.zeros(1)
        itl_mean = (times[-1] - times[0]) / max(len(times) - 1, 1)
        return float(times[0]), float(itl_mean), float(np.percentile(gaps, 90))

    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0
