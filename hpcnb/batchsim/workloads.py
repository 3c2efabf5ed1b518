"""Workloads: jobs from SWF traces, the rigid→malleable policy, a Lublin–Feitelson generator.

**Trace replay.** :func:`jobs_from_swf` turns each SWF line into a rigid job with the
recorded submit time, run time (field 4) and processor count (field 5, else field 8);
one processor is one node. The requested time (field 9) becomes the job's walltime
for backfilling when present. Jobs whose run time, size or submit time is unknown are
skipped and listed in :attr:`TraceJobs.skipped`.

**Jobs larger than the machine** follow the one policy of every batchsim reader (SWF
here, ElastiSim JSON in :func:`~hpcnb.batchsim.elastisim.read_elastisim`, the
``hpcnb batchsim simulate`` command): by default they are skipped and reported
(``"job <id>: <n> nodes > machine of <N>"``); with ``strict=True`` (``--strict``) the
first one raises :class:`~hpcnb.batchsim.swf.SWFFormatError` naming its file and line.
Machine sizes are bounded by :data:`~hpcnb.batchsim.swf.MAX_NODES` (2**31 - 1).

**Rigid → malleable policy** (:class:`MalleablePolicy`). A seeded random fraction of the
jobs with more than one node become malleable. A converted job keeps its size as the
preferred size and may run on ``[ceil(n·min_factor), min(N, n·max_factor)]`` nodes.
Its recorded run time is the time on ``n`` nodes, scaled to other sizes by Amdahl's law
with serial fraction ``serial_fraction`` and split into ``units`` iterations whose
boundaries are the scheduling points; each resize costs ``reconfiguration_cost``
seconds. Single-node jobs stay rigid.

**Lublin–Feitelson generator** (:func:`lublin_feitelson`). A reconstruction of the
model of Lublin and Feitelson (JPDC 2003) for batch jobs: sizes from a two-stage
log-uniform distribution with a serial-job probability and a preference for powers of
two; the log of the run time from a hyper-gamma distribution whose mixing probability
falls with the job size; inter-arrival times whose log is gamma-distributed, thinned by
a daily cycle. Parameters are the paper's published batch-job values as we recall
them; the daily cycle is a cosine (peak at 14:00) rather than the paper's
gamma-shaped arrival-count model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hpcnb.batchsim.jobs import FixedWork, Job, JobType, ScaledWork
from hpcnb.batchsim.swf import MAX_NODES, SWFFormatError, SWFTrace, trace_from_arrays
from hpcnb.errors import InvalidInputError

__all__ = [
    "LublinParameters",
    "MalleablePolicy",
    "RigidArrays",
    "TraceJobs",
    "jobs_from_swf",
    "lublin_feitelson",
    "make_malleable",
    "rigid_arrays_from_swf",
]


@dataclass(frozen=True)
class MalleablePolicy:
    """How rigid trace jobs become malleable (see the module docstring).

    Attributes:
        fraction: Share of multi-node jobs converted, in [0, 1].
        min_factor: Smallest size as a fraction of the recorded size.
        max_factor: Largest size as a multiple of the recorded size.
        serial_fraction: Amdahl serial fraction of converted jobs.
        units: Iterations per converted job.
        reconfiguration_cost: Cost of one resize (s).
        seed: Seed of the random choice of jobs.
    """

    fraction: float = 0.0
    min_factor: float = 0.5
    max_factor: float = 2.0
    serial_fraction: float = 0.05
    units: int = 10
    reconfiguration_cost: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise InvalidInputError(
                f"malleable fraction {self.fraction}: expected a value in [0, 1]"
            )
        if not (0 < self.min_factor <= 1.0 <= self.max_factor):
            raise InvalidInputError(
                f"min_factor={self.min_factor}, max_factor={self.max_factor}: "
                "expected 0 < min_factor <= 1 <= max_factor"
            )


@dataclass
class TraceJobs:
    """Jobs read from a trace and what was left out.

    Attributes:
        jobs: The jobs, in trace order.
        num_nodes: Machine size used (argument, else header MaxProcs / MaxNodes).
        skipped: ``"job <id>: reason"`` for each trace line not simulated.
    """

    jobs: list[Job]
    num_nodes: int
    skipped: list[str] = field(default_factory=list)


def jobs_from_swf(
    trace: SWFTrace,
    num_nodes: int | None = None,
    policy: MalleablePolicy | None = None,
    *,
    strict: bool = False,
) -> TraceJobs:
    """Turn SWF lines into jobs (see the module docstring for the rules).

    Args:
        trace: The trace.
        num_nodes: Machine size in ``[1, MAX_NODES]``; default the header's ``MaxProcs``
            or ``MaxNodes``.
        policy: Rigid→malleable conversion; default all rigid.
        strict: Raise on a job larger than the machine instead of skipping it.

    Raises:
        InvalidInputError: No machine size given and none in the header, or ``num_nodes``
            outside ``[1, MAX_NODES]``.
        SWFFormatError: ``strict`` and a job larger than the machine (``file:line``).
    """
    rows = rigid_arrays_from_swf(trace, num_nodes, strict=strict)
    jobs = [
        Job(
            int(rows.ids[i]),
            float(rows.submit[i]),
            JobType.RIGID,
            int(rows.size[i]),
            FixedWork(float(rows.runtime[i])),
            walltime=float(rows.walltime[i]) if rows.walltime[i] > 0 else None,
            user=int(rows.user[i]),
        )
        for i in range(len(rows.ids))
    ]
    if policy is not None and policy.fraction > 0:
        jobs = make_malleable(jobs, rows.num_nodes, policy)
    return TraceJobs(jobs, rows.num_nodes, rows.skipped)


@dataclass(frozen=True)
class RigidArrays:
    """A trace's simulated jobs as columns, in trace order (no :class:`Job` objects).

    What :func:`jobs_from_swf` builds its rigid jobs from; the compiled kernels read it
    as it is (:func:`~hpcnb.batchsim.simulation.simulate_rigid`), so a million-job trace
    is replayed without a million Python objects.

    Attributes:
        ids: Job ids.
        submit: Submit times (s).
        size: Nodes of each job.
        runtime: Run times (s).
        walltime: Requested times (s); ``0`` where unknown (the run time is reserved).
        user: User ids (``0`` where unknown).
        num_nodes: Machine size used.
        skipped: ``"job <id>: reason"`` for each trace line not simulated.
        rows: Each job's row in the trace (``trace.line_of(row)`` names its line).
    """

    ids: np.ndarray
    submit: np.ndarray
    size: np.ndarray
    runtime: np.ndarray
    walltime: np.ndarray
    user: np.ndarray
    num_nodes: int
    skipped: list[str]
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def rigid_arrays_from_swf(
    trace: SWFTrace, num_nodes: int | None = None, *, strict: bool = False
) -> RigidArrays:
    """Return the jobs :func:`jobs_from_swf` would simulate, as columns.

    Args:
        trace: The trace.
        num_nodes: Machine size in ``[1, MAX_NODES]``; default the header's ``MaxProcs``
            or ``MaxNodes``.
        strict: Raise on a job larger than the machine instead of skipping it.

    Raises:
        InvalidInputError: No machine size given and none in the header, ``num_nodes``
            outside ``[1, MAX_NODES]``, or a run or requested time that is not finite
            (the message names the job and its line).
        SWFFormatError: ``strict`` and a job larger than the machine (``file:line``).
    """
    if num_nodes is not None and (
        isinstance(num_nodes, bool)
        or not isinstance(num_nodes, (int, np.integer))
        or not 1 <= num_nodes <= MAX_NODES
    ):
        raise InvalidInputError(f"num_nodes={num_nodes!r}: expected an integer in [1, {MAX_NODES}]")
    nodes = int(num_nodes) if num_nodes is not None else trace.machine_size()
    if nodes is None:
        raise InvalidInputError(
            f"{trace.source}: no machine size: pass num_nodes (--nodes) or add a "
            "'; MaxProcs:' / '; MaxNodes:' header line"
        )
    f = trace.fields
    run = f["run_time"]
    allocated = np.trunc(f["allocated_processors"])
    size = np.where(allocated > 0, allocated, np.trunc(f["requested_processors"]))
    submit = f["submit_time"]
    unknown_run = run < 0
    unknown_size = ~unknown_run & (size <= 0)
    too_large = ~unknown_run & ~unknown_size & (size > nodes)
    unknown_submit = ~unknown_run & ~unknown_size & ~too_large & (submit < 0)
    if strict and too_large.any():
        i = int(np.argmax(too_large))
        raise SWFFormatError(
            f"{trace.line_of(i)}: job {int(f['job_id'][i])} needs "
            f"{int(size[i])} nodes, the machine has {nodes} (strict: jobs "
            "larger than the machine are errors)"
        )
    reasons = (
        (unknown_run, lambda i: "unknown run time"),
        (unknown_size, lambda i: "unknown size"),
        (too_large, lambda i: f"{int(size[i])} nodes > machine of {nodes}"),
        (unknown_submit, lambda i: "unknown submit time"),
    )
    skip = unknown_run | unknown_size | too_large | unknown_submit
    skipped = [(i, reason(i)) for mask, reason in reasons for i in np.flatnonzero(mask)]
    skipped.sort(key=lambda item: item[0])
    ids = f["job_id"].astype(np.int64)
    keep = np.flatnonzero(~skip)
    req = f["requested_time"][keep]
    for name, values in (("run time", run[keep]), ("requested time", req)):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(keep[bad[0]])
            raise InvalidInputError(
                f"{trace.line_of(i)}: job {int(ids[i])}: {name} {values[bad[0]]} is not finite"
            )
    return RigidArrays(
        ids=ids[keep],
        submit=np.asarray(submit[keep], dtype=np.float64),
        size=size[keep].astype(np.int64),
        runtime=np.asarray(run[keep], dtype=np.float64),
        walltime=np.where(req > 0, req, 0.0).astype(np.float64),
        user=np.maximum(f["user_id"][keep], 0).astype(np.int64),
        num_nodes=nodes,
        skipped=[f"job {int(ids[i])}: {why}" for i, why in skipped],
        rows=keep,
    )


def make_malleable(jobs: Sequence[Job], num_nodes: int, policy: MalleablePolicy) -> list[Job]:
    """Convert a seeded random share of the multi-node rigid jobs to malleable ones.

    Each chosen job keeps its run time at its recorded size and scales by Amdahl's law
    (:class:`~hpcnb.batchsim.jobs.ScaledWork`) within the policy's size factors.

    Args:
        jobs: The jobs; only rigid ones of more than one node are candidates.
        num_nodes: Nodes of the machine (the largest size a job may grow to).
        policy: Share of the candidates, size factors, scaling and seed.

    Returns:
        A new list with the chosen jobs malleable, the others unchanged.
    """
    rng = np.random.default_rng(policy.seed)
    candidates = [i for i, j in enumerate(jobs) if j.num_nodes > 1 and j.type is JobType.RIGID]
    count = round(policy.fraction * len(candidates))
    chosen = set(rng.permutation(len(candidates))[:count].tolist())
    out = list(jobs)
    for k, i in enumerate(candidates):
        if k not in chosen:
            continue
        job = jobs[i]
        runtime = job.work.estimate(job.num_nodes, None)  # type: ignore[arg-type]
        lo = max(1, math.ceil(job.num_nodes * policy.min_factor))
        hi = max(job.num_nodes, min(num_nodes, int(job.num_nodes * policy.max_factor)))
        work = ScaledWork(
            runtime,
            job.num_nodes,
            policy.serial_fraction,
            policy.units,
            policy.reconfiguration_cost,
        )
        out[i] = replace(job, type=JobType.MALLEABLE, work=work, num_nodes_min=lo, num_nodes_max=hi)
    return out


@dataclass(frozen=True)
class LublinParameters:
    """Parameters of the Lublin–Feitelson batch model (see the module docstring).

    Attributes:
        serial_prob: Probability of a one-node job.
        pow2_prob: Probability that a parallel size is rounded to a power of two.
        u_low: Lower bound of log2(size).
        u_med_offset: The two-stage break point is ``log2(N) - u_med_offset``.
        u_prob: Probability of the lower stage.
        a1: Shape of the first gamma of log run time.
        b1: Scale of the first gamma.
        a2: Shape of the second gamma.
        b2: Scale of the second gamma.
        pa: Slope of the mixing probability in the size.
        pb: Intercept of the mixing probability.
        a_arr: Shape of the gamma of log inter-arrival time.
        b_arr: Scale of the gamma of log inter-arrival time.
        daily_amplitude: Relative amplitude of the daily arrival cycle in [0, 1).
        load_scale: Divides inter-arrival times (> 1 raises the load).
    """

    serial_prob: float = 0.244
    pow2_prob: float = 0.576
    u_low: float = 0.8
    u_med_offset: float = 2.5
    u_prob: float = 0.86
    a1: float = 4.2
    b1: float = 0.94
    a2: float = 312.0
    b2: float = 0.03
    pa: float = -0.0054
    pb: float = 0.78
    a_arr: float = 10.23
    b_arr: float = 0.4871
    daily_amplitude: float = 0.5
    load_scale: float = 1.0


def lublin_feitelson(
    num_jobs: int,
    num_nodes: int,
    seed: int = 0,
    params: LublinParameters | None = None,
    max_runtime: float = 5 * 86400.0,
) -> SWFTrace:
    """Generate a synthetic batch workload as an SWF trace.

    Args:
        num_jobs: Number of jobs.
        num_nodes: Machine size (sizes never exceed it).
        seed: RNG seed.
        params: Model parameters.
        max_runtime: Run times are capped here (s).

    Returns:
        An :class:`SWFTrace` with submit, run time, size and a requested time (the run
        time rounded up to the next of 15 min, 1 h, 4 h, 12 h, 1 d, 5 d, as users do).
    """
    if num_jobs < 0 or num_nodes < 1:
        raise InvalidInputError(
            f"num_jobs={num_jobs}, num_nodes={num_nodes}: expected >= 0 and >= 1"
        )
    p = params or LublinParameters()
    rng = np.random.default_rng(seed)
    u_hi = math.log2(num_nodes)
    u_med = max(p.u_low, u_hi - p.u_med_offset)
    serial = rng.random(num_jobs) < p.serial_prob
    lower = rng.random(num_jobs) < p.u_prob
    log_size = np.where(
        lower, rng.uniform(p.u_low, u_med, num_jobs), rng.uniform(u_med, max(u_hi, u_med), num_jobs)
    )
    pow2 = rng.random(num_jobs) < p.pow2_prob
    size = np.where(pow2, 2.0 ** np.round(log_size), np.round(2.0**log_size))
    size = np.where(serial, 1, np.clip(size, 1, num_nodes)).astype(np.int64)
    mix = np.clip(p.pa * size + p.pb, 0.0, 1.0)
    first = rng.random(num_jobs) < mix
    log_run = np.where(first, rng.gamma(p.a1, p.b1, num_jobs), rng.gamma(p.a2, p.b2, num_jobs))
    runtime = np.minimum(np.round(np.exp(log_run)), max_runtime)
    submit = np.empty(num_jobs)
    t = 0.0
    k = 0
    while k < num_jobs:
        t += math.exp(rng.gamma(p.a_arr, p.b_arr)) / p.load_scale
        hour = (t / 3600.0) % 24.0
        rate = 1.0 + p.daily_amplitude * math.cos((hour - 14.0) / 24.0 * 2 * math.pi)
        if rng.random() * (1.0 + p.daily_amplitude) <= rate:
            submit[k] = round(t)
            k += 1
    limits = np.array([900, 3600, 4 * 3600, 12 * 3600, 86400, 5 * 86400], dtype=float)
    requested = limits[np.minimum(np.searchsorted(limits, runtime), len(limits) - 1)]
    requested = np.maximum(requested, runtime)
    header = {
        "Version": "2.2",
        "Computer": "Lublin-Feitelson synthetic (hpcnb)",
        "MaxJobs": str(num_jobs),
        "MaxNodes": str(num_nodes),
        "MaxProcs": str(num_nodes),
        "Note": f"seed {seed}",
    }
    return trace_from_arrays(submit, runtime, size, requested, header)
