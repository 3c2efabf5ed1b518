"""Typed contracts of PipeInfer jobs: what a job asks for, what a run reports, what a stage did.

A :class:`JobSpec` names a model (:class:`TransformerSpec`), how its layers are split over
the ranks, and one :class:`GenerationSpec` per generation, each with an optional draft (a
:class:`DraftSpec`, named in JSON by a kind of :data:`DRAFTS` or by a
``"package.module:attr"`` reference; the built-in kinds are in
:mod:`hpcnb.speculative.drafts`). It crosses the MPI boundary as JSON (``to_json`` /
``from_json``); every generation comes back as a :class:`RunResult` holding the
:class:`StageEvent` log of every rank. ``from_json`` names any missing or unknown key
(:class:`SpecError`).

Example:
    >>> from hpcnb.speculative.contracts import GenerationSpec, JobSpec, SpecError, TransformerSpec
    >>> model = TransformerSpec("tiny", n_layers=4)
    >>> job = JobSpec(model, [GenerationSpec("pipeline", [1, 2], 8)])
    >>> JobSpec.from_json(job.to_json()) == job
    True
    >>> try:
    ...     JobSpec.from_json({"model": {"kind": "tiny"}, "runs": [{"n_new": 8}]})
    ... except SpecError as err:
    ...     print(err)
    run 0 lacks 'strategy' (required: strategy, prompt, n_new)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from hpcnb.errors import HpcnbError
from hpcnb.plugins import PluginError, Registry
from hpcnb.speculative.head import STRATEGIES, Draft, HeadPolicy

if TYPE_CHECKING:
    from hpcnb.speculative.model import LlamaModel

__all__ = [
    "DRAFTS",
    "DraftSpec",
    "FaultSpec",
    "GenerationSpec",
    "JobSpec",
    "RunResult",
    "SpecError",
    "StageEvent",
    "TransformerSpec",
    "register_draft",
]

MODEL_KINDS = ("tiny", "gguf")
FAULT_KINDS = ("kill", "hang")
EVENT_KINDS = ("compute", "skip", "draft")


class SpecError(HpcnbError, ValueError):
    """A job specification or result is malformed: a missing or unknown key, a bad value."""


def _checked(cls: type, data: Any, what: str) -> dict[str, Any]:
    """Return ``data`` as keyword arguments of dataclass ``cls``, naming a bad key.

    Raises:
        SpecError: ``data`` is not a mapping, has a key ``cls`` lacks, or lacks a field
            without a default.
    """
    if not isinstance(data, Mapping):
        raise SpecError(f"{what} must be a JSON object, got {type(data).__name__}")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise SpecError(f"{what} has unknown key {unknown[0]!r} (known: {', '.join(names)})")
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for name in required:
        if name not in data:
            raise SpecError(f"{what} lacks {name!r} (required: {', '.join(required)})")
    return dict(data)


def _one_of(value: str, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise SpecError(f"{what}={value!r}; expected one of {tuple(allowed)}")


class _FlatJson:
    """Mixin of flat frozen dataclasses whose JSON form is their fields."""

    _what: ClassVar[str] = "value"
    _kinds: ClassVar[tuple[str, tuple[str, ...]] | None] = None
    """``(what, allowed)``: the ``kind`` field must be one of ``allowed`` (``None``: any)."""

    def __post_init__(self) -> None:
        """Check the ``kind`` field against ``_kinds``."""
        if self._kinds is not None:
            what, allowed = self._kinds
            _one_of(self.__dict__["kind"], allowed, what)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Build from the JSON form (raises :class:`SpecError` naming a bad key)."""
        return cls(**_checked(cls, data, cls._what))


# -- drafts: a registry of kinds ----------------------------------------------------------


def _draft_class_problem(obj: Any) -> str | None:
    """Why ``obj`` cannot be a draft kind (``None``: it can)."""
    if isinstance(obj, type) and issubclass(obj, DraftSpec) and dataclasses.is_dataclass(obj):
        return None
    return f"expected a DraftSpec dataclass, got {obj!r}"


DRAFTS: Registry[type[DraftSpec]] = Registry(
    "draft", check=_draft_class_problem, builtins="hpcnb.speculative.feature_draft"
)
"""Registered draft kinds: ``kind`` -> its :class:`DraftSpec` subclass. The built-in kinds
register when :mod:`hpcnb.speculative.drafts` and :mod:`hpcnb.speculative.feature_draft`
(which imports the former) are imported, which the registry does the first time it is read;
``DRAFTS.get("package.module:MyDraftSpec")`` imports a user's module."""

_D = TypeVar("_D", bound="type[DraftSpec]")


def register_draft(kind: str, *, replace: bool = False) -> Callable[[_D], _D]:
    """Class decorator: register a :class:`DraftSpec` subclass under ``kind``.

    Registering the same class again does nothing.

    Args:
        kind: The name a job's JSON gives as ``{"kind": kind}`` (no ``:``).
        replace: Replace another class registered under ``kind`` instead of refusing it.

    Raises:
        SpecError: ``kind`` is registered already for another class (without
            ``replace``), has a ``:``, or the class is not a :class:`DraftSpec` dataclass.
    """

    def register(cls: _D) -> _D:
        try:
            DRAFTS.register(kind, cls, replace=replace)
        except PluginError as err:
            raise SpecError(str(err)) from None
        cls.kind = kind
        return cls

    return register


def _importable(cls: type) -> bool:
    """Whether another process can import ``cls`` by ``"module:qualname"``."""
    return cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__


class DraftSpec:
    """What the head should draft with; subclasses are frozen dataclasses of their options.

    A subclass implements :meth:`build`. A job names it by a registered kind
    (:func:`register_draft`) or by reference, ``{"kind": "package.module:MyDraftSpec"}``
    (registered or not), or ``{"kind": "package.module:"}`` for a module that registers one
    kind when imported. Every MPI rank resolves the name itself, importing the module; see
    :mod:`hpcnb.speculative.drafts` for the built-in kinds and how to add one.
    """

    kind: ClassVar[str] = ""

    def build(self, head_model: LlamaModel | None) -> Draft:
        """Return the draft (with ``name`` and ``propose(context, k)``) on the head rank.

        Args:
            head_model: The target's layers the head holds (at least
                :meth:`head_layers` of them, with embeddings and head), or ``None``.
        """
        raise NotImplementedError

    def head_layers(self) -> int:
        """Layers of the target the head must load for this draft (0: none)."""
        return 0

    def needs_features(self) -> bool:
        """Whether the draft reads the target's final hidden states.

        When ``True``, the pipeline's last rank sends each run's final hidden states back
        with its tokens, and the head passes those of verified positions to the draft's
        ``observe(tokens, start, feats)``.
        """
        return False

    def json_kind(self) -> str:
        """The ``kind`` written to JSON: a name every process of a job resolves.

        A kind of :mod:`hpcnb.speculative.drafts` is written by name; a user's class by its
        reference ``"module:qualname"`` (its module is then imported by every rank, and
        registers its kind there too); a registered class that cannot be imported by
        reference (defined in ``__main__`` or in a function) by its registered name.

        Raises:
            SpecError: The class is neither registered nor importable by reference.
        """
        cls = type(self)
        registered = bool(cls.kind) and cls.kind in DRAFTS and DRAFTS.get(cls.kind) is cls
        if registered and (cls.__module__.startswith("hpcnb.") or not _importable(cls)):
            return cls.kind
        if _importable(cls):
            return f"{cls.__module__}:{cls.__qualname__}"
        raise SpecError(
            f"draft {cls.__qualname__} has no name another process can resolve: define it in "
            "an importable module, or register it with register_draft"
        )

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form: ``{"kind": ..., **options}`` (``kind``: :meth:`json_kind`)."""
        return {"kind": self.json_kind(), **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @staticmethod
    def from_json(data: Any, what: str = "draft") -> DraftSpec:
        """Build the draft spec that ``data["kind"]`` names (a kind or a reference).

        Args:
            data: ``{"kind": ..., **options}``.
            what: What the draft belongs to, for messages.

        Raises:
            SpecError: No ``kind``, one that does not resolve to a :class:`DraftSpec`
                dataclass (unknown, not importable, the wrong type), or a bad option key.
        """
        if not isinstance(data, Mapping) or "kind" not in data:
            raise SpecError(f"{what} must be a JSON object with a 'kind', got {data!r}")
        kind = data["kind"]
        if not isinstance(kind, str):
            raise SpecError(f"{what}: 'kind' must be a text, got {kind!r}")
        try:
            cls = DRAFTS.get(kind)
        except PluginError as err:
            raise SpecError(f"{what}: {err}") from None
        options = {k: v for k, v in data.items() if k != "kind"}
        return cls(**_checked(cls, options, f"{what} {kind!r}"))


# -- the job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerSpec(_FlatJson):
    """The target model: a Llama-architecture decoder.

    Attributes:
        kind: ``"tiny"`` (random weights, no file) or ``"gguf"`` (SmolLM2 or ``path``).
        n_layers: Layers of a tiny model.
        vocab_size: Vocabulary of a tiny model.
        seed: Seed of a tiny model's weights.
        scale: Scale of a tiny model's random weights.
        path: GGUF file (``None``: SmolLM2 from the data registry).
    """

    kind: str
    n_layers: int = 4
    vocab_size: int = 96
    seed: int = 0
    scale: float = 1.0
    path: str | None = None
    _what: ClassVar[str] = "model"
    _kinds: ClassVar[tuple[str, tuple[str, ...]] | None] = ("model kind", MODEL_KINDS)


@dataclass(frozen=True)
class GenerationSpec:
    """One generation: a strategy, a prompt, a draft and the head's limits.

    Attributes:
        strategy: ``"pipeline"``, ``"speculative"`` or ``"pipeinfer"``.
        prompt: Prompt token ids (stored as a tuple).
        n_new: Tokens to generate.
        draft: The draft (needed by the speculative strategies).
        k: Most draft tokens per speculative run.
        max_inflight: Most runs in flight (``pipeinfer``).
        max_ahead: Most unverified tokens beyond the committed ones (``pipeinfer``).
        plain_drafts: ``pipeinfer``: the run from the committed tokens also drafts.
        adaptive: Adapt the draft length and runs in flight to the acceptance so far
            (:class:`~hpcnb.speculative.head.HeadPolicy`).
    """

    strategy: str
    prompt: Sequence[int]
    n_new: int
    draft: DraftSpec | None = None
    k: int = 4
    max_inflight: int = 4
    max_ahead: int = 12
    plain_drafts: bool = False
    adaptive: bool = False

    def __post_init__(self) -> None:
        """Check the strategy; store the prompt as a tuple of ints."""
        _one_of(self.strategy, STRATEGIES, "strategy")
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (the draft as its own JSON form)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["prompt"] = list(self.prompt)
        data["draft"] = None if self.draft is None else self.draft.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, what: str = "generation") -> GenerationSpec:
        """Build from the JSON form.

        Args:
            data: The generation's JSON object (its draft by kind or reference).
            what: What the generation is, for messages (``"run 2"``).

        Raises:
            SpecError: A missing or unknown key (named), a bad value or draft.
        """
        kwargs = _checked(cls, data, what)
        if kwargs.get("draft") is not None:
            kwargs["draft"] = DraftSpec.from_json(kwargs["draft"], f"{what}'s draft")
        return cls(**kwargs)


@dataclass(frozen=True)
class FaultSpec(_FlatJson):
    """An injected failure, for tests: rank ``rank`` dies or hangs after ``after`` messages.

    Attributes:
        rank: The failing rank.
        kind: ``"kill"`` (SIGKILL itself) or ``"hang"`` (sleep for an hour).
        after: Messages handled before the fault.
    """

    rank: int
    kind: str
    after: int = 0
    _what: ClassVar[str] = "the job's fault"
    _kinds: ClassVar[tuple[str, tuple[str, ...]] | None] = ("fault kind", FAULT_KINDS)


@dataclass(frozen=True)
class JobSpec:
    """One MPI job: a model split over the ranks and the generations to run, in order.

    Attributes:
        model: The target model.
        runs: The generations, run one after another in the same job.
        split: ``(start, end)`` layer slices, one per rank (``None``: an even split).
        threads: Torch threads per rank.
        timeout_s: Longest wait for any message inside the job (then the job aborts).
        poll_s: Sleep between polls for messages.
        stage_delay_s: Seconds added to every run on a rank (``{rank: s}``, to emulate a
            slower stage).
        fault: An injected failure (tests).
    """

    model: TransformerSpec
    runs: Sequence[GenerationSpec]
    split: Sequence[tuple[int, int]] | None = None
    threads: int = 1
    timeout_s: float = 30.0
    poll_s: float = 2e-4
    stage_delay_s: Mapping[int, float] = field(default_factory=dict)
    fault: FaultSpec | None = None

    def __post_init__(self) -> None:
        """Check there is a generation; store sequences as tuples, delays by int rank."""
        if not self.runs:
            raise SpecError("a job needs at least one generation in runs")
        object.__setattr__(self, "runs", tuple(self.runs))
        if self.split is not None:
            split = tuple((int(a), int(b)) for a, b in self.split)
            object.__setattr__(self, "split", split)
        delays = {int(r): float(s) for r, s in self.stage_delay_s.items()}
        object.__setattr__(self, "stage_delay_s", delays)

    def head_layers(self) -> int:
        """Layers of the target the head must load for the drafts of all generations."""
        return max((g.draft.head_layers() for g in self.runs if g.draft is not None), default=0)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (every generation written out in full)."""
        return {
            "model": self.model.to_json(),
            "runs": [g.to_json() for g in self.runs],
            "split": None if self.split is None else [list(s) for s in self.split],
            "threads": self.threads,
            "timeout_s": self.timeout_s,
            "poll_s": self.poll_s,
            "stage_delay_s": {str(r): s for r, s in self.stage_delay_s.items()},
            "fault": None if self.fault is None else self.fault.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        """Build from the JSON form.

        Keys of :class:`GenerationSpec` at the top level are defaults for every entry of
        ``runs`` (one generation of the defaults alone when ``runs`` is absent), so
        ``{"model": ..., "strategy": "pipeline", "prompt": [...], "n_new": 8}`` is a job.

        Raises:
            SpecError: A missing or unknown key (named), or a bad value.
        """
        if not isinstance(data, Mapping):
            raise SpecError(f"a job must be a JSON object, got {type(data).__name__}")
        gen_keys = {f.name for f in dataclasses.fields(GenerationSpec)}
        defaults = {k: v for k, v in data.items() if k in gen_keys}
        top = {k: v for k, v in data.items() if k not in gen_keys}
        runs = top.get("runs") or [{}]
        kwargs = _checked(cls, {**top, "runs": runs}, "the job")
        kwargs["model"] = TransformerSpec.from_json(kwargs["model"])
        if not isinstance(runs, Sequence) or isinstance(runs, str):
            raise SpecError(f"the job's runs must be a list, got {type(runs).__name__}")
        kwargs["runs"] = tuple(
            GenerationSpec.from_json({**defaults, **_checked_map(r, f"run {i}")}, f"run {i}")
            for i, r in enumerate(runs)
        )
        if kwargs.get("stage_delay_s") is None:
            kwargs.pop("stage_delay_s", None)
        if kwargs.get("fault") is not None:
            kwargs["fault"] = FaultSpec.from_json(kwargs["fault"])
        return cls(**kwargs)


def _checked_map(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(f"{what} of the job must be a JSON object, got {type(data).__name__}")
    return data


# -- what comes back ----------------------------------------------------------------------


@dataclass(frozen=True)
class StageEvent(_FlatJson):
    """One thing a rank did, for timelines (MPI runtime and simulator alike).

    Attributes:
        rank: The rank.
        run_id: The run.
        kind: ``"compute"`` (ran its layers), ``"skip"`` (dropped a cancelled run) or
            ``"draft"`` (the head drafted the run's tokens).
        t0: Start in seconds since the generation started.
        t1: End in seconds.
        n_tokens: Tokens of the run.
        speculative: Whether the run carries draft tokens.
    """

    rank: int
    run_id: int
    kind: str
    t0: float
    t1: float
    n_tokens: int
    speculative: bool
    _what: ClassVar[str] = "event"


@dataclass(frozen=True)
class RunResult:
    """Metrics and logs of one generation, run over MPI or simulated.

    Attributes:
        strategy: The strategy.
        tokens: The generated tokens.
        n_new: Tokens generated.
        ranks: MPI ranks (pipeline stages).
        draft: Name of the draft (``None`` without one).
        elapsed_s: Seconds from the first launch to the last commit.
        tokens_per_s: ``n_new / elapsed_s``.
        ttft_s: Time to the first generated token.
        itl_mean_s: Mean inter-token latency.
        itl_p90_s: 90th percentile of the gaps between committed tokens.
        acceptance_rate: Accepted / drafted tokens.
        drafted: Draft tokens proposed.
        accepted: Draft tokens accepted.
        runs: Runs launched.
        cancelled_runs: Runs cancelled while in flight.
        computed: Per rank, tokens run through its layers.
        skipped: Per rank, tokens of cancelled runs it dropped.
        useful_positions: Positions committed to every stage's cache (the useful work).
        events: Every rank's :class:`StageEvent` log.
    """

    strategy: str
    tokens: tuple[int, ...]
    n_new: int
    ranks: int
    draft: str | None
    elapsed_s: float
    tokens_per_s: float
    ttft_s: float
    itl_mean_s: float
    itl_p90_s: float
    acceptance_rate: float
    drafted: int
    accepted: int
    runs: int
    cancelled_runs: int
    computed: tuple[int, ...]
    skipped: tuple[int, ...]
    useful_positions: int
    events: tuple[StageEvent, ...] = ()

    @classmethod
    def from_policy(
        cls,
        policy: HeadPolicy,
        *,
        ranks: int,
        elapsed_s: float,
        computed: Sequence[int],
        skipped: Sequence[int],
        events: Sequence[StageEvent],
        t_start: float = 0.0,
    ) -> RunResult:
        """Collect the result of a finished generation driven by ``policy``.

        Args:
            policy: The head's policy, after its last commit.
            ranks: Pipeline stages.
            elapsed_s: Seconds from the first launch to the end.
            computed: Per rank, tokens computed.
            skipped: Per rank, tokens of cancelled runs dropped.
            events: Every rank's events.
            t_start: Time of the first launch on the clock of ``policy.commit_times``.
        """
        ttft, itl_mean, itl_p90 = policy.latencies(t_start)
        return cls(
            strategy=policy.strategy,
            tokens=tuple(policy.generated()),
            n_new=policy.n_new,
            ranks=ranks,
            draft=getattr(policy.draft, "name", None),
            elapsed_s=elapsed_s,
            tokens_per_s=policy.n_new / elapsed_s,
            ttft_s=ttft,
            itl_mean_s=itl_mean,
            itl_p90_s=itl_p90,
            acceptance_rate=policy.acceptance_rate(),
            drafted=policy.drafted,
            accepted=policy.accepted,
            runs=policy.n_runs,
            cancelled_runs=policy.n_cancelled,
            computed=tuple(computed),
            skipped=tuple(skipped),
            useful_positions=policy.seq0_len,
            events=tuple(events),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("tokens", "computed", "skipped"):
            data[name] = list(data[name])
        data["events"] = [e.to_json() for e in self.events]
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunResult:
        """Build from the JSON form (raises :class:`SpecError` naming a bad key)."""
        kwargs = _checked(cls, data, "run result")
        for name in ("tokens", "computed", "skipped"):
            kwargs[name] = tuple(int(v) for v in kwargs[name])
        kwargs["events"] = tuple(StageEvent.from_json(e) for e in kwargs.get("events", ()))
        return cls(**kwargs)
