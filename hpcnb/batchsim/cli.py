"""``hpcnb batchsim ...``: simulate workloads from the command line.

Sub-commands::

    hpcnb batchsim simulate WORKLOAD [--scheduler NAME|package.module:Class] [--nodes N]
        [--strict] [--malleable-fraction F] [--seed S] [--on-error error|skip]
        [--allocation first-fit|contiguous|topology] [--network shared|isolated] --out DIR
    hpcnb batchsim generate OUT.swf [--jobs N] [--nodes N] [--seed S]
    hpcnb batchsim schedulers
    hpcnb batchsim validate-dl MODEL_DIR [--train-max-nodes N] [--folds K] [--seed S]

``WORKLOAD`` is an SWF trace (``.swf`` / ``.swf.gz``) or an ElastiSim ``jobs.json``.
``simulate`` writes ``job_statistics.csv`` (ElastiSim columns), ``node_utilization.csv``
(per node in ElastiSim's shape with ``--allocation``, else the allocated-node count) and
``metrics.json`` into ``DIR`` and prints the metrics. The scheduler defaults to
``elastisim-fcfs`` for an ElastiSim ``jobs.json`` and ``fcfs`` for an SWF trace; a
scheduler of your own is named ``package.module:Class`` (a subclass of
:class:`~hpcnb.batchsim.scheduler.Scheduler`; the module is imported from ``sys.path``,
so ``PYTHONPATH`` can point at its folder). With an SWF trace, trace jobs are replayed
with their recorded submit times, run times and sizes on ``--nodes`` nodes (default: the
header's MaxProcs or MaxNodes; one processor = one node); jobs with unknown run time or
size are reported and skipped. ``--nodes`` is an integer in ``[1, MAX_NODES]``
(2**31 - 1). ``--malleable-fraction`` converts that share of multi-node jobs to
malleable ones (:class:`~hpcnb.batchsim.workloads.MalleablePolicy`). ``schedulers``
lists the built-in policies, one line each; ``validate-dl`` fits the DL step-time
workload model to a measured ``scalability.csv`` and prints its parameters and, as the
last line, ``MAPE <value>`` on runs left out of the fit.

**Jobs larger than the machine** (after ``--nodes``), from either kind of workload, are
skipped and reported on stderr by default; ``--strict`` makes the first one an error.

**Bad input** (an unknown scheduler or one that does not import, a malformed SWF line,
a broken ``.gz`` file, an invalid ElastiSim input or expression, any reader limit, a
missing file) ends ``simulate`` with exit status 2 and one line on stderr,
``hpcnb batchsim simulate: <file>:<place>: <reason>`` (for a scheduler: the name and the
registered ones), never a traceback; malformed SWF lines are skipped instead with
``--on-error skip``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpcnb.argtypes import whole_number
from hpcnb.batchsim.jobs import Job
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.policies import SCHEDULERS, make_scheduler
from hpcnb.batchsim.scheduler import FCFS, EasyBackfilling
from hpcnb.batchsim.swf import DEFAULT_SWF_LIMITS, MAX_NODES, read_swf, write_swf
from hpcnb.batchsim.workloads import (
    MalleablePolicy,
    RigidArrays,
    jobs_from_swf,
    lublin_feitelson,
    make_malleable,
    rigid_arrays_from_swf,
)
from hpcnb.errors import HpcnbError, InvalidInputError

__all__ = [
    "generate_command",
    "handler",
    "register",
    "schedulers_command",
    "simulate_command",
    "validate_dl_command",
]


class _OversizedJobError(HpcnbError, ValueError):
    """A job needs more nodes or GPUs than the machine has, under ``--strict``."""


def _fit_machine(
    jobs: list[Job], platform: Platform, source: Path, strict: bool
) -> tuple[list[Job], list[str]]:
    """Apply the policy for jobs larger than the machine: skip and report, or fail."""
    kept: list[Job] = []
    notes: list[str] = []
    for job in jobs:
        reason = None
        if job.num_nodes_min > platform.num_nodes:
            reason = f"{job.num_nodes_min} nodes > machine of {platform.num_nodes}"
        elif job.gpus_per_node > platform.gpus_per_node:
            reason = f"{job.gpus_per_node} GPUs per node > {platform.gpus_per_node}"
        if reason is None:
            kept.append(job)
        elif strict:
            raise _OversizedJobError(f"{source}: job {job.id}: {reason} (--strict)")
        else:
            notes.append(f"{source}: skipped job {job.id}: {reason}")
    return kept, notes


def _load(
    args: argparse.Namespace, columnar: bool = False
) -> tuple[list[Job] | RigidArrays, Platform, dict[str, Any], list[str], int]:
    """Read the workload: jobs, platform, simulation options, skip notes and skip count.

    With ``columnar`` (an SWF trace replayed rigidly under a compiled policy) the jobs
    come back as :class:`RigidArrays` columns instead of :class:`Job` objects.
    """
    path = Path(args.workload)
    policy = MalleablePolicy(args.malleable_fraction, seed=args.seed)
    if path.suffix == ".json":
        from hpcnb.batchsim.elastisim import read_elastisim  # imported when used: fast errors

        data = read_elastisim(path, num_nodes=args.nodes, strict=args.strict)
        notes = [f"{path}: skipped {note}" for note in data.skipped]
        platform = data.platform
        jobs, oversized = _fit_machine(list(data.jobs), platform, path, args.strict)
        if policy.fraction > 0:
            jobs = make_malleable(jobs, platform.num_nodes, policy)
        notes += oversized
        return jobs, platform, data.simulation_options(), notes, len(notes)
    if not (path.name.endswith(".swf") or path.name.endswith(".swf.gz")):
        raise InvalidInputError(f"{path}: expected a .swf, .swf.gz or ElastiSim jobs .json file")
    trace = read_swf(path, on_error=args.on_error)
    if columnar and policy.fraction == 0:
        rows = rigid_arrays_from_swf(trace, args.nodes, strict=args.strict)
        notes = list(trace.skipped) + [f"{path}: skipped {s}" for s in rows.skipped]
        count = max(trace.skipped_count, len(trace.skipped)) + len(rows.skipped)
        return rows, Platform(rows.num_nodes), {}, notes, count
    loaded = jobs_from_swf(trace, args.nodes, policy, strict=args.strict)
    notes = list(trace.skipped) + [f"{path}: skipped {s}" for s in loaded.skipped]
    count = max(trace.skipped_count, len(trace.skipped)) + len(loaded.skipped)
    return loaded.jobs, Platform(loaded.num_nodes), {}, notes, count


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (no traceback, no embedded line breaks)."""
    text = " ".join(str(exc).split("\n")).strip()
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return text or type(exc).__name__


def simulate_command(args: argparse.Namespace) -> int:
    """Run ``simulate`` for parsed arguments; return the exit code (0 ok, 2 bad input)."""
    try:
        name = args.scheduler or (
            "elastisim-fcfs" if str(args.workload).endswith(".json") else "fcfs"
        )
        scheduler = make_scheduler(name)
        # rigid replay under exactly FCFS / EASY: columns straight into the compiled kernel
        columnar = type(scheduler) in (FCFS, EasyBackfilling) and not args.allocation
        jobs, platform, options, notes, count = _load(args, columnar)
        from hpcnb.batchsim.simulation import simulate, simulate_rigid  # errors come first

        if args.allocation:
            options["allocation"] = args.allocation
        if args.network:
            options["network"] = args.network
        if isinstance(jobs, RigidArrays):
            rows = jobs
            columns = (rows.ids, rows.submit, rows.size, rows.runtime, rows.walltime, rows.user)
            result = simulate_rigid(*columns, platform, scheduler)
        else:
            result = simulate(jobs, platform, scheduler, **options)
    except (HpcnbError, ValueError, OSError) as exc:
        print(f"hpcnb batchsim simulate: {_one_line(exc)}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    if count:
        print(f"{count} line(s)/job(s) skipped (listed above)", file=sys.stderr)
    paths = result.write(args.out)
    metrics = json.loads(paths["metrics"].read_text(encoding="utf-8"))
    metrics["skipped"] = count
    paths["metrics"].write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    print(
        f"{len(jobs)} jobs on {platform.num_nodes} nodes under {scheduler.name}: "
        f"{result.jobs_per_second:,.0f} simulated jobs/s"
    )
    for key, value in metrics.items():
        print(f"  {key}: {value}")
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def generate_command(args: argparse.Namespace) -> int:
    """Write a Lublin–Feitelson workload as SWF; return the exit code."""
    max_jobs = DEFAULT_SWF_LIMITS.max_rows
    if not (1 <= args.jobs <= max_jobs and 1 <= args.nodes <= MAX_NODES):
        print(
            f"hpcnb batchsim generate: --jobs must be in [1, {max_jobs}] and --nodes in "
            f"[1, {MAX_NODES}]",
            file=sys.stderr,
        )
        return 2
    trace = lublin_feitelson(args.jobs, args.nodes, args.seed)
    path = write_swf(trace, args.output)
    print(f"wrote {len(trace)} jobs for {args.nodes} nodes to {path}")
    return 0


def schedulers_command(args: argparse.Namespace) -> int:
    """Print each registered scheduler's name and the first line of its docstring; return 0."""
    for name, cls in SCHEDULERS.items():
        summary = next(iter((cls.__doc__ or "").strip().splitlines()), "")
        print(f"{name:14s} {summary}")
    return 0


def validate_dl_command(args: argparse.Namespace) -> int:
    """Fit and validate the DL step-time model on one model folder; return the exit code."""
    from hpcnb.batchsim.dl import scaling_validation  # SciPy: imported when used

    try:
        model, test, mape = scaling_validation(
            args.model_dir, args.train_max_nodes, folds=args.folds, seed=args.seed
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"hpcnb batchsim validate-dl: {exc}", file=sys.stderr)
        return 2
    protocol = (
        f"fit on <= {args.train_max_nodes} nodes"
        if args.train_max_nodes
        else f"{args.folds}-fold cross-validation"
    )
    print(f"{model.expression}")
    for key, value in model.params.items():
        print(f"  {key} = {value:.6g}")
    print(f"{len(test)} runs predicted ({protocol})")
    print(f"MAPE {mape:.4f}")
    return 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: expected a fraction in [0, 1]")
    return value


def _add_int_options(parser: argparse.ArgumentParser, *options: tuple[str, int, str]) -> None:
    """Add integer options given as ``(flag, default, help)``; each help ends with its default."""
    for flag, default, text in options:
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default: %(default)s)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``batchsim`` sub-command and its commands (listed in the module docstring)."""
    parser = subparsers.add_parser("batchsim", help="batch-system simulation (ElastiSim-style)")
    sub = parser.add_subparsers(dest="batchsim_command", required=True)
    sim = sub.add_parser("simulate", help="simulate an SWF trace or an ElastiSim jobs.json")
    sim.add_argument("workload", help=".swf, .swf.gz or ElastiSim jobs.json")
    sim.add_argument(
        "--scheduler",
        default=None,
        metavar="NAME",
        help="a built-in policy (`hpcnb batchsim schedulers` lists them) or your own "
        "Scheduler subclass as package.module:Class (default: elastisim-fcfs for an "
        "ElastiSim jobs.json, fcfs for an SWF trace)",
    )
    sim.add_argument(
        "--nodes",
        type=whole_number("--nodes", high=MAX_NODES),
        default=None,
        help="machine size, 1..2**31-1 (default: the workload's)",
    )
    sim.add_argument(
        "--strict",
        action="store_true",
        help="fail on a job larger than the machine (default: skip it)",
    )
    sim.add_argument(
        "--malleable-fraction",
        type=_fraction,
        default=0.0,
        help="share of multi-node jobs made malleable, 0..1 (default: %(default)s)",
    )
    _add_int_options(sim, ("--seed", 0, "seed of the malleable choice"))
    sim.add_argument(
        "--on-error",
        choices=("error", "skip"),
        default="error",
        help="malformed SWF lines: fail (default) or skip and report",
    )
    sim.add_argument(
        "--allocation",
        default=None,
        choices=("first-fit", "contiguous", "topology"),
        help="give nodes identity with this placement policy (per-node "
        "node_utilization.csv); default: nodes counted",
    )
    sim.add_argument(
        "--network",
        default=None,
        choices=("shared", "isolated"),
        help="PFS and links shared by jobs (default) or contention-free",
    )
    sim.add_argument("--out", required=True, help="output folder")
    gen = sub.add_parser("generate", help="write a Lublin-Feitelson synthetic SWF workload")
    gen.add_argument("output", help="output .swf or .swf.gz")
    _add_int_options(
        gen,
        ("--jobs", 10000, "jobs to generate"),
        ("--nodes", 256, "machine size the jobs are drawn for"),
        ("--seed", 0, "seed of the generator"),
    )
    sub.add_parser("schedulers", help="list the built-in scheduling policies")
    val = sub.add_parser("validate-dl", help="validate the DL workload model on measured data")
    val.add_argument("model_dir", help="folder with scalability.csv (Pollux format)")
    val.add_argument(
        "--train-max-nodes",
        type=int,
        default=None,
        help="extrapolate: fit on <= N nodes (default: cross-validation)",
    )
    _add_int_options(
        val, ("--folds", 5, "cross-validation folds"), ("--seed", 0, "seed of the fold split")
    )
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    """Dispatch ``hpcnb batchsim <command>``; return the exit code."""
    commands = {
        "simulate": simulate_command,
        "generate": generate_command,
        "schedulers": schedulers_command,
        "validate-dl": validate_dl_command,
    }
    return commands[args.batchsim_command](args)
