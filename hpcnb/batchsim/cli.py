"""``hpcnb batchsim ...``: simulate workloads from the command line.

Sub-commands::

    hpcnb batchsim simulate WORKLOAD --scheduler NAME [--nodes N]
        [--malleable-fraction F] [--seed S] [--on-error error|skip] --out DIR
    hpcnb batchsim generate OUT.swf [--jobs N] [--nodes N] [--seed S]
    hpcnb batchsim schedulers
    hpcnb batchsim validate-dl MODEL_DIR [--train-max-nodes N] [--folds K] [--seed S]

``WORKLOAD`` is an SWF trace (``.swf`` / ``.swf.gz``) or an ElastiSim ``jobs.json``.
``simulate`` writes ``job_statistics.csv`` (ElastiSim columns), ``node_utilization.csv``
and ``metrics.json`` into ``DIR`` and prints the metrics. With an SWF trace, trace
jobs are replayed with their recorded submit times, run times and sizes on ``--nodes``
nodes (default: the header's MaxProcs or MaxNodes; one processor = one node); jobs
with unknown run time or size, or larger than the machine, are reported and skipped.
``--malleable-fraction`` converts that share of multi-node jobs to malleable ones
(:class:`~hpcnb.batchsim.workloads.MalleablePolicy`). ``schedulers`` lists the policies;
``validate-dl`` fits the DL step-time workload model to a measured ``scalability.csv`` and
prints its parameters and, as the last line, ``MAPE <value>`` on runs left out of the fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpcnb.batchsim.dl import scaling_validation
from hpcnb.batchsim.elastisim import read_elastisim
from hpcnb.batchsim.jobs import Job
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.policies import SCHEDULERS, make_scheduler
from hpcnb.batchsim.simulation import simulate
from hpcnb.batchsim.swf import SWFError, read_swf, write_swf
from hpcnb.batchsim.workloads import (
    MalleablePolicy,
    jobs_from_swf,
    lublin_feitelson,
    make_malleable,
)

__all__ = [
    "generate_command",
    "handler",
    "register",
    "schedulers_command",
    "simulate_command",
    "validate_dl_command",
]


def _load(args: argparse.Namespace) -> tuple[list[Job], Platform, dict[str, Any], list[str]]:
    path = Path(args.workload)
    policy = MalleablePolicy(args.malleable_fraction, seed=args.seed)
    if path.suffix == ".json":
        data = read_elastisim(path)
        platform = data.platform
        if args.nodes:
            platform = Platform(**{**platform.__dict__, "num_nodes": args.nodes})
        jobs = data.jobs
        if policy.fraction > 0:
            jobs = make_malleable(jobs, platform.num_nodes, policy)
        return jobs, platform, data.simulation_options(), []
    if not (path.name.endswith(".swf") or path.name.endswith(".swf.gz")):
        raise ValueError(f"{path}: expected a .swf, .swf.gz or ElastiSim jobs .json file")
    trace = read_swf(path, on_error=args.on_error)
    loaded = jobs_from_swf(trace, args.nodes, policy)
    notes = list(trace.skipped) + [f"{path}: skipped {s}" for s in loaded.skipped]
    return loaded.jobs, Platform(loaded.num_nodes), {}, notes


def simulate_command(args: argparse.Namespace) -> int:
    """Run ``simulate`` for parsed arguments; return the exit code (0 ok, 2 bad input)."""
    try:
        scheduler = make_scheduler(args.scheduler)
        jobs, platform, options, notes = _load(args)
    except (ValueError, FileNotFoundError, SWFError) as exc:
        print(f"hpcnb batchsim simulate: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    if notes:
        print(f"{len(notes)} line(s)/job(s) skipped (listed above)", file=sys.stderr)
    result = simulate(jobs, platform, scheduler, **options)
    paths = result.write(args.out)
    metrics = json.loads(paths["metrics"].read_text(encoding="utf-8"))
    metrics["skipped"] = len(notes)
    paths["metrics"].write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    print(f"{len(jobs)} jobs on {platform.num_nodes} nodes under {scheduler.name}: "
          f"{result.jobs_per_second:,.0f} simulated jobs/s")  # fmt: skip
    for key, value in metrics.items():
        print(f"  {key}: {value}")
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def generate_command(args: argparse.Namespace) -> int:
    """Write a Lublin–Feitelson workload as SWF; return the exit code."""
    if args.jobs < 1 or args.nodes < 1:
        print("hpcnb batchsim generate: --jobs and --nodes must be >= 1", file=sys.stderr)
        return 2
    trace = lublin_feitelson(args.jobs, args.nodes, args.seed)
    path = write_swf(trace, args.output)
    print(f"wrote {len(trace)} jobs for {args.nodes} nodes to {path}")
    return 0


def schedulers_command(args: argparse.Namespace) -> int:
    """Print each scheduler's name and summary line; return 0."""
    for name, cls in sorted(SCHEDULERS.items()):
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:14s} {summary}")
    return 0


def validate_dl_command(args: argparse.Namespace) -> int:
    """Fit and validate the DL step-time model on one model folder; return the exit code."""
    try:
        model, test, mape = scaling_validation(
            args.model_dir, args.train_max_nodes, folds=args.folds, seed=args.seed
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"hpcnb batchsim validate-dl: {exc}", file=sys.stderr)
        return 2
    protocol = (f"fit on <= {args.train_max_nodes} nodes" if args.train_max_nodes
                else f"{args.folds}-fold cross-validation")  # fmt: skip
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``batchsim`` sub-command (with ``simulate`` and ``generate``)."""
    parser = subparsers.add_parser("batchsim", help="batch-system simulation (ElastiSim-style)")
    sub = parser.add_subparsers(dest="batchsim_command", required=True)
    sim = sub.add_parser("simulate", help="simulate an SWF trace or an ElastiSim jobs.json")
    sim.add_argument("workload", help=".swf, .swf.gz or ElastiSim jobs.json")
    sim.add_argument("--scheduler", required=True, choices=sorted(SCHEDULERS))
    sim.add_argument("--nodes", type=int, default=None, help="machine size (default: header)")
    sim.add_argument("--malleable-fraction", type=_fraction, default=0.0,
                     help="share of multi-node jobs made malleable (0..1)")  # fmt: skip
    sim.add_argument("--seed", type=int, default=0, help="seed of the malleable choice")
    sim.add_argument("--on-error", choices=("error", "skip"), default="error",
                     help="malformed SWF lines: fail (default) or skip and report")  # fmt: skip
    sim.add_argument("--out", required=True, help="output folder")
    gen = sub.add_parser("generate", help="write a Lublin-Feitelson synthetic SWF workload")
    gen.add_argument("output", help="output .swf or .swf.gz")
    gen.add_argument("--jobs", type=int, default=10000)
    gen.add_argument("--nodes", type=int, default=256)
    gen.add_argument("--seed", type=int, default=0)
    sub.add_parser("schedulers", help="list the scheduling policies")
    val = sub.add_parser("validate-dl", help="validate the DL workload model on measured data")
    val.add_argument("model_dir", help="folder with scalability.csv (Pollux format)")
    val.add_argument("--train-max-nodes", type=int, default=None,
                     help="extrapolate: fit on <= N nodes (default: cross-validation)")  # fmt: skip
    val.add_argument("--folds", type=int, default=5)
    val.add_argument("--seed", type=int, default=0)
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
