"""Blind advice: the rules run on unmodified kernels, then the fix each fired rule names is timed.

The advice is not told which symptom a kernel has. For every kernel of
:data:`BLIND_KERNELS` (the suite kernels and the case-study kernels before their fix):

1. the kernel is profiled with a trace on the thread count the fix will be timed with, and
   the locality metrics use a cache capacity scaled from this machine's last-level cache
   to the profiled footprint (:func:`hpcnb.commprof.locality.scaled_capacity`), so a
   "far" event is one that would leave that cache at the timed size;
2. the rules of :mod:`hpcnb.commprof.advice` fire on it;
3. a fired ``padding`` rule is checked by profiling an input twice as large: false sharing
   whose rate falls below :data:`FADE` of its rate lies at block boundaries, which the timed
   input (hundreds of times larger) dilutes, and the rule is withdrawn; a fired
   ``schedule`` rule is checked by a what-if the profiler can run, because it
   controls the schedule: the kernel is profiled again under the other schedules
   (:data:`WHAT_IF_SCHEDULES`); the rule stands when one of them at least halves the
   communication events with per-thread accesses within ``balance`` of even, and that
   schedule is its fix. Otherwise the rule is withdrawn (the events are inherent to the
   algorithm, not to the schedule) and the what-if is reported;
4. every fired rule whose fix the kernel has a variant for (:class:`Fix`, written with the
   kernel without knowing whether a rule would fire) is timed natively against the
   unmodified kernel in interleaved rounds.

The C suite (:mod:`hpcnb.commprof.csuite`) goes through the same steps
(:func:`blind_c_advice`): each C kernel is profiled under valgrind on its own arrays, and a
fired rule is tried where the C program can take the fix (:func:`c_fix`): padded inputs
for k-means, more tiles for Needleman-Wunsch, and for padding elsewhere a build that puts
every array on cache lines of its own (``-DCS_ALIGN``). The valgrind trace has no barrier
phases, so ``blocking`` cannot fire on a C program, and a C program has no schedule knob
for a what-if, so a fired ``schedule`` rule stands untested there.

Scoring (:func:`score_advice`): *precision* is the share of fired rules whose fix runs at
least ``threshold`` (1.1) times faster (median of the per-round speed-ups; a fired rule
without a fix variant counts as not confirmed); *recall* is the share of the known fixes
(:attr:`BlindKernel.known`: a fix that was written with the kernel because the kernel was
written to need it) whose rule fired. Both come with Wilson intervals over the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

import hpcnb.commprof.cases as C
from hpcnb.commprof.advice import Advice, AdviceThresholds, advise
from hpcnb.commprof.locality import LocalityConfig, analyse_locality, scaled_capacity
from hpcnb.commprof.runtime import Profile, Schedule
from hpcnb.commprof.suite import SUITE
from hpcnb.errors import InvalidInputError, UnknownNameError
from hpcnb.stats import Estimate, median_interval, wilson_interval
from hpcnb.timing import ratios

__all__ = [
    "BLIND_KERNELS",
    "FADE",
    "WHAT_IF_SCHEDULES",
    "BlindKernel",
    "BlindResult",
    "Fix",
    "FixTiming",
    "blind_advice",
    "blind_c_advice",
    "blind_kernel",
    "c_fix",
    "time_c_fix",
    "fix_variant",
    "score_advice",
    "time_fix",
    "words_of",
]

Make = Callable[[int, int, int], tuple[C.Args, int]]

#: Schedules tried by the what-if of a fired ``schedule`` rule.
WHAT_IF_SCHEDULES = (Schedule("static"), Schedule("cyclic", 1), Schedule("cyclic", 16))


@dataclass(frozen=True)
class Fix:
    """A variant of a kernel with the fix one rule names applied.

    Attributes:
        rule: The rule whose suggestion it applies.
        variant: The fixed configuration.
        description: One line on the change.
    """

    rule: str
    variant: C.Variant
    description: str


@dataclass(frozen=True)
class BlindKernel:
    """A kernel run through the blind advice.

    Attributes:
        name: Short name.
        variant: The unmodified configuration.
        fixes: Fix variants written for this kernel, one per rule at most.
        known: The rule of the fix the kernel was written to need (for recall only; the
            advice never sees it), or ``None``.
        scale: Factor on the size unit of the timed runs (kernels whose inputs are small
            per size unit run longer inputs, so that a timed run lasts milliseconds).
        note: One line on the kernel.
    """

    name: str
    variant: C.Variant
    fixes: tuple[Fix, ...] = ()
    known: str | None = None
    scale: int = 1
    note: str = ""

    def fix(self, rule: str) -> Fix | None:
        """The fix variant for ``rule``, or ``None`` when the kernel has none.

        Args:
            rule: Rule name.
        """
        return next((f for f in self.fixes if f.rule == rule), None)


def _kmeans_padded(pad_lines: int) -> Make:
    """Suite k-means inputs with each thread's partial sums and counts on lines of their own."""
    base = SUITE["kmeans"].make

    def make(n: int, T: int, seed: int) -> tuple[C.Args, int]:
        args, nphases = base(n, T, seed)
        x, cent, psum, _, label = args
        k, dim = np.shape(psum)[1], np.shape(psum)[2]
        rows = max(k, pad_lines * 8 // dim)  # centroid rows per thread: whole lines
        return [
            x,
            cent,
            np.zeros((T, rows, dim)),
            np.zeros((T, max(k, 8 * pad_lines)), np.int64),
            label,
        ], nphases

    return make


def _suite_variant(name: str, make: Make | None = None) -> C.Variant:
    case = SUITE[name]
    return C.Variant(case.kernel, case.make if make is None else make, case.schedule)


def _from_case(name: str, case: str, scale: int, note: str, known: bool = True) -> BlindKernel:
    """A case study's kernel before its fix, with the fix as the variant of the case's rule."""
    cs = C.CASE_STUDIES[case]
    fix = Fix(cs.rule, cs.after, cs.description)
    return BlindKernel(name, cs.before, (fix,), cs.rule if known else None, scale, note)


def _kernels() -> dict[str, BlindKernel]:
    cs = C.CASE_STUDIES
    # kernels with little work per size unit run longer inputs, so a timed run lasts 5 ms or more
    longer = {"radix_sort": 64}
    out = [
        BlindKernel(
            name, _suite_variant(name), scale=longer.get(name, 1), note=SUITE[name].description
        )
        for name in SUITE
        if name not in ("kmeans", "needleman_wunsch")
    ]
    out += [
        BlindKernel(
            "kmeans",
            _suite_variant("kmeans"),
            (
                Fix(
                    "padding",
                    _suite_variant("kmeans", _kmeans_padded(2)),
                    "each thread's partial sums and counts padded to whole cache lines",
                ),
            ),
            scale=64,
            note=SUITE["kmeans"].description,
        ),
        BlindKernel(
            "needleman_wunsch",
            _suite_variant("needleman_wunsch"),
            (Fix("blocking", cs["wavefront"].after, cs["wavefront"].description),),
            known="blocking",
            note="one column tile per thread (the wavefront case study's kernel)",
        ),
        _from_case("histogram", "histogram", 16, "per-thread histogram rows of 4 bins, adjacent"),
        _from_case("sum", "sum", 16, "running sums acc[tid] += x[i]*x[i], adjacent", known=False),
        _from_case("jacobi_cyclic", "jacobi", 1, "Jacobi with rows dealt cyclically"),
        _from_case("particles", "particles", 4, "position update on an array of structures"),
        BlindKernel(
            "clean_scale",
            C.Variant(C.clean_scale, C.clean_inputs),
            note="y = 2x on disjoint blocks: nothing to advise",
        ),
    ]
    return {k.name: k for k in out}


#: The kernels of the blind advice: the suite (k-means with a padded variant, the
#: Needleman-Wunsch wavefront with a variant of more tiles per thread) and the case-study
#: kernels before their fix (the wavefront case is the suite's Needleman-Wunsch).
BLIND_KERNELS: dict[str, BlindKernel] = _kernels()


def words_of(args: Iterable[object]) -> int:
    """Elements of the array arguments of a kernel (its footprint in words).

    Args:
        args: The kernel's own arguments.
    """
    return int(sum(a.size for a in args if isinstance(a, np.ndarray)))


@dataclass(frozen=True)
class BlindResult:
    """The advice on one unmodified kernel.

    Attributes:
        kernel: Kernel name.
        advice: The rules that fired (after the schedule what-if).
        withdrawn: Rules that fired and were withdrawn, with the reason.
        capacity: Cache-capacity threshold in words used for the metrics.
        schedule_fix: The schedule the what-if found for a standing ``schedule`` rule.
    """

    kernel: str
    advice: tuple[Advice, ...]
    withdrawn: dict[str, str] = field(default_factory=dict)
    capacity: int = 0
    schedule_fix: Schedule | None = None

    @property
    def rules(self) -> tuple[str, ...]:
        """Distinct fired rules, in the order they first fired."""
        return tuple(dict.fromkeys(a.rule for a in self.advice))


def _thread_balance(p: Profile) -> float:
    """Max over threads of accesses over the mean."""
    assert p.trace is not None
    per = np.bincount(p.trace[:, 0], minlength=p.nthreads).astype(float)
    return float(per.max() / per.mean()) if per.sum() else 1.0


def _what_if(
    v: C.Variant, size: int, nthreads: int, seed: int, balance: float
) -> tuple[Schedule | None, str]:
    """Profile ``v`` under the other schedules; the one that halves events, or why none."""
    args, nph = v.make(size, nthreads, seed)
    now = v.profile(args, nthreads=nthreads, nphases=nph).total()
    tried = []
    best: tuple[int, Schedule] | None = None
    for s in WHAT_IF_SCHEDULES:
        if s == v.schedule:
            continue
        args, nph = v.make(size, nthreads, seed)
        p = replace(v, schedule=s).profile(args, nthreads=nthreads, nphases=nph, trace=True)
        ev, bal = p.total(), _thread_balance(p)
        tried.append(f"{s.kind}/{s.chunk}: {ev} events, balance {bal:.2f}")
        if bal <= balance and 2 * ev <= now and (best is None or ev < best[0]):
            best = (ev, s)
    why = f"{now} events now; " + "; ".join(tried)
    return (None if best is None else best[1]), why


def _check_sizes(where: str, size: int, nthreads: int, timed_size: int, cache: int) -> None:
    if min(size, nthreads, timed_size, cache) < 1:
        raise InvalidInputError(
            f"{where}: size={size}, nthreads={nthreads}, timed_size={timed_size}, "
            f"cache={cache} must all be >= 1"
        )


def blind_advice(
    bk: BlindKernel,
    size: int,
    nthreads: int,
    *,
    cache: int,
    timed_size: int,
    line_bytes: int = 64,
    thresholds: AdviceThresholds | None = None,
    balance: float = 1.25,
    seed: int = 0,
) -> BlindResult:
    """Run the metrics and the rules on an unmodified kernel (module docstring, steps 1-3).

    Args:
        bk: The kernel.
        size: Size unit of the profiled run.
        nthreads: Threads (those the fixes are timed with).
        cache: Last-level cache in bytes the capacity is scaled from.
        timed_size: Size unit of the timed runs (times ``bk.scale``).
        line_bytes: Cache-line size for false sharing.
        thresholds: Rule thresholds.
        balance: Largest per-thread access imbalance (max / mean) a what-if schedule may have.
        seed: Input seed.

    Raises:
        InvalidInputError: A size, thread count or cache that is not positive.
    """
    _check_sizes(f"blind_advice({bk.name})", size, nthreads, timed_size, cache)

    def profile_at(n: int) -> tuple[Profile, int]:
        args, nph = bk.variant.make(n, nthreads, seed)
        return bk.variant.profile(args, nthreads=nthreads, nphases=nph, trace=True), words_of(args)

    timed = words_of(bk.variant.make(timed_size * bk.scale, nthreads, seed)[0])
    advice, withdrawn, capacity = _judge(profile_at, size, timed, cache, line_bytes, thresholds)
    schedule_fix = None
    if any(a.rule == "schedule" for a in advice):
        schedule_fix, why = _what_if(bk.variant, size, nthreads, seed, balance)
        if schedule_fix is None:
            withdrawn["schedule"] = "no schedule halves the events: " + why
            advice = [a for a in advice if a.rule != "schedule"]
    return BlindResult(bk.name, tuple(advice), withdrawn, capacity, schedule_fix)


#: A padding rule is withdrawn when doubling the input leaves less than this share of the
#: false-sharing rate: the falsely shared lines are block boundaries, which a timed input
#: hundreds of times larger dilutes away.
FADE = 2 / 3


def _judge(
    profile_at: Callable[[int], tuple[Profile, int]],
    size: int,
    timed_words: int,
    cache: int,
    line_bytes: int,
    thresholds: AdviceThresholds | None,
) -> tuple[list[Advice], dict[str, str], int]:
    """Rules on the profile at ``size``, and the input-doubling check of padding."""
    p, words = profile_at(size)
    capacity = scaled_capacity(cache, words, timed_words)
    config = LocalityConfig(line_bytes=line_bytes, capacity=capacity)
    mets, _ = analyse_locality(p, config)
    advice = advise(p.regions, mets, p.nthreads, thresholds)
    withdrawn: dict[str, str] = {}
    if any(a.rule == "padding" for a in advice):
        rate = sum(m.private_false_sharing for m in mets) / max(1, sum(m.accesses for m in mets))
        mets2, _ = analyse_locality(profile_at(2 * size)[0], config)
        rate2 = sum(m.private_false_sharing for m in mets2) / max(1, sum(m.accesses for m in mets2))
        if rate2 < FADE * rate:
            withdrawn["padding"] = (
                f"false sharing falls from {rate:.1%} to {rate2:.1%} of the accesses when the "
                "input doubles: block boundaries, diluted at the timed size"
            )
            advice = [a for a in advice if a.rule != "padding"]
    return advice, withdrawn, capacity


def fix_variant(bk: BlindKernel, result: BlindResult, rule: str) -> tuple[C.Variant, str] | None:
    """The variant that applies ``rule``'s fix to ``bk`` and its description, if there is one.

    A standing ``schedule`` rule's fix is the what-if schedule; other rules use the kernel's
    :class:`Fix` variants.

    Args:
        bk: The kernel.
        result: Its blind advice.
        rule: A fired rule.
    """
    if rule == "schedule" and result.schedule_fix is not None:
        s = result.schedule_fix
        return replace(bk.variant, schedule=s), f"schedule {s.kind} (chunk {s.chunk})"
    fix = bk.fix(rule)
    return None if fix is None else (fix.variant, fix.description)


@dataclass(frozen=True)
class FixTiming:
    """Native timing of one fix against the unmodified kernel.

    Attributes:
        kernel: Kernel name.
        rule: The rule whose fix was timed.
        description: The fix.
        speedups: Per-round speed-ups (unmodified / fixed), interleaved rounds.
    """

    kernel: str
    rule: str
    description: str
    speedups: tuple[float, ...]

    @property
    def estimate(self) -> Estimate:
        """Median speed-up with the order-statistic interval of the median."""
        return median_interval(self.speedups)


def time_fix(
    bk: BlindKernel,
    rule: str,
    fixed: C.Variant,
    description: str,
    *,
    size: int,
    nthreads: int = 2,
    repeats: int = 7,
    seed: int = 0,
) -> FixTiming:
    """Time the native parallel kernel before and after a fix, interleaved.

    Args:
        bk: The kernel.
        rule: The rule whose fix it is.
        fixed: The fixed configuration.
        description: One line on the fix.
        size: Size unit of the timed runs (times ``bk.scale``).
        nthreads: Threads.
        repeats: Timed rounds (after one warm-up round).
        seed: Input seed.
    """
    cs = C.CaseStudy(bk.name, rule, bk.variant, fixed, description)
    before, after, _ = C.measure_case(cs, size * bk.scale, nthreads, repeats=repeats, seed=seed)
    return FixTiming(bk.name, rule, description, ratios(before, after))


def score_advice(
    fired: Sequence[tuple[str, str, float | None]],
    known: Sequence[tuple[str, str]],
    threshold: float = 1.1,
) -> tuple[Estimate, Estimate]:
    """Precision and recall of blind advice (module docstring).

    Args:
        fired: ``(kernel, rule, median speed-up of its fix or None when no fix was timed)``
            for every fired rule.
        known: ``(kernel, rule)`` of every known fix.
        threshold: Speed-up a fix must reach to confirm its rule.

    Returns:
        ``(precision, recall)`` with Wilson intervals (``n`` = fired rules, known fixes).

    Raises:
        InvalidInputError: No fired rule or no known fix (nothing to score).
    """
    if not fired or not known:
        raise InvalidInputError(
            f"score_advice: need fired rules and known fixes, got {len(fired)} and {len(known)}"
        )
    confirmed = sum(1 for _, _, s in fired if s is not None and s >= threshold)
    found = {(k, r) for k, r, _ in fired}
    hits = sum(1 for pair in known if tuple(pair) in found)
    return wilson_interval(confirmed, len(fired)), wilson_interval(hits, len(known))


def blind_kernel(name: str) -> BlindKernel:
    """Look up a kernel of :data:`BLIND_KERNELS`.

    Args:
        name: Kernel name.

    Raises:
        UnknownNameError: No such kernel.
    """
    if name not in BLIND_KERNELS:
        raise UnknownNameError(f"blind kernel {name!r}: expected one of {sorted(BLIND_KERNELS)}")
    return BLIND_KERNELS[name]


def blind_c_advice(
    name: str,
    size: int,
    nthreads: int,
    *,
    cache: int,
    timed_size: int,
    line_bytes: int = 64,
    thresholds: AdviceThresholds | None = None,
    seed: int = 0,
) -> BlindResult:
    """The metrics and rules on a C suite kernel profiled under valgrind (module docstring).

    Args:
        name: Suite kernel (its C program).
        size: Size unit of the profiled run.
        nthreads: Worker threads.
        cache: Last-level cache in bytes the capacity is scaled from.
        timed_size: Size unit of the timed runs.
        line_bytes: Cache-line size for false sharing.
        thresholds: Rule thresholds.
        seed: Input seed.

    Raises:
        InvalidInputError: A size, thread count or cache that is not positive.
        CompileError: gcc is missing or fails.
        TraceError: valgrind fails.
    """
    from hpcnb.commprof.csuite import kernel_profile

    _check_sizes(f"blind_c_advice({name})", size, nthreads, timed_size, cache)
    case = SUITE[name]

    def profile_at(n: int) -> tuple[Profile, int]:
        args, nph = case.make(n, nthreads, seed)
        return kernel_profile(name, args, nph, nthreads), words_of(args)

    timed = words_of(case.make(timed_size * blind_kernel(name).scale, nthreads, seed)[0])
    advice, withdrawn, capacity = _judge(profile_at, size, timed, cache, line_bytes, thresholds)
    return BlindResult(f"{name}.c", tuple(advice), withdrawn, capacity, None)


def c_fix(name: str, rule: str) -> tuple[Make, tuple[str, ...], str] | None:
    """The fix a C suite program can take for ``rule``: fixed inputs, extra gcc flags, text.

    Args:
        name: Suite kernel.
        rule: A fired rule.
    """
    fix = blind_kernel(name).fix(rule)
    if fix is not None and fix.variant.kernel is SUITE[name].kernel:
        return fix.variant.make, (), fix.description
    if rule == "padding":
        return SUITE[name].make, ("-DCS_ALIGN",), "every array on cache lines of its own"
    return None


def time_c_fix(
    name: str, rule: str, *, size: int, nthreads: int = 2, repeats: int = 7, seed: int = 0
) -> FixTiming | None:
    """Time a C suite program before and after the fix :func:`c_fix` names, interleaved.

    Args:
        name: Suite kernel.
        rule: The fired rule.
        size: Size unit of the timed runs (times the kernel's ``scale``).
        nthreads: Worker threads.
        repeats: Timed rounds (after one warm-up round).
        seed: Input seed.

    Returns:
        The timing, or ``None`` when the program cannot take that rule's fix.
    """
    from hpcnb.commprof.csuite import time_kernels

    fix = c_fix(name, rule)
    if fix is None:
        return None
    make, defines, text = fix
    n = size * blind_kernel(name).scale
    before, nb = SUITE[name].make(n, nthreads, seed)
    after, na = make(n, nthreads, seed)
    t = time_kernels(
        name, {"before": (before, nb, ()), "after": (after, na, defines)}, nthreads, repeats=repeats
    )
    return FixTiming(f"{name}.c", rule, text, ratios(t["before"], t["after"]))
