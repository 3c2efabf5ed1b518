"""``hpcnb perfmodel ...``: command-line access to the performance model.

``hpcnb perfmodel validate-scaling DIR [--predictions CSV] [--algorithm ring|tree]
[--gradient-bytes N] [--overlap W]`` fits the multi-node step-time model on
``DIR/placements.csv`` only, predicts every row of ``DIR/scalability.csv``, optionally writes
per-row predictions, and prints the fitted parameters and, as its last line, ``MAPE <value>``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from hpcnb.perfmodel.allreduce import ALGORITHMS
from hpcnb.perfmodel.scaling import ScalingDataError, validate_scaling

__all__ = ["handler", "register", "validate_scaling_command"]


def validate_scaling_command(args: argparse.Namespace) -> int:
    """Run ``validate-scaling`` for parsed arguments; return the exit code.

    Args:
        args: Namespace with ``directory``, ``predictions``, ``algorithm``,
            ``gradient_bytes`` and ``overlap``.
    """
    try:
        result = validate_scaling(
            args.directory,
            algorithm=args.algorithm,
            gradient_bytes=args.gradient_bytes,
            fixed_overlap=args.overlap,
        )
    except (ScalingDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.predictions:
        try:
            result.write_predictions(args.predictions)
        except OSError as exc:
            print(f"error: --predictions {args.predictions}: {exc}", file=sys.stderr)
            return 2
        print(f"predictions: {args.predictions} ({len(result.test)} rows)")
    params = result.model.params_
    unit = "s/gradient" if args.gradient_bytes is None else "s/byte"
    print(f"model: {result.name} ({args.algorithm} all-reduce, beta in {unit})")
    for field in fields(params):
        print(f"  {field.name:<12} {getattr(params, field.name):.6g}")
    print(f"train MAPE {result.train_mape:.4f} (placements.csv, {result.model.n_samples_} rows)")
    print(f"MAPE {result.mape:.3f}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``perfmodel`` sub-command (with its own sub-commands) to ``hpcnb``.

    Args:
        subparsers: The top-level parser's sub-parsers.
    """
    parser = subparsers.add_parser(
        "perfmodel", help="ConvMeter-style runtime and scalability models"
    )
    inner = parser.add_subparsers(dest="perfmodel_command", required=True)
    val = inner.add_parser(
        "validate-scaling",
        help="fit on DIR/placements.csv, predict DIR/scalability.csv, print the MAPE",
    )
    val.add_argument("directory", metavar="DIR", help="model folder in the Pollux format")
    val.add_argument("--predictions", metavar="CSV", help="write per-row predictions here")
    val.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="ring",
        help="all-reduce algorithm of the communication term (default: %(default)s)",
    )
    val.add_argument(
        "--gradient-bytes",
        type=float,
        default=None,
        help="gradient size in bytes if known (beta is then seconds per byte; default: "
        "unknown, beta is seconds per gradient)",
    )
    val.add_argument(
        "--overlap",
        type=float,
        default=None,
        help="hold the overlap factor fixed, 0..1 (default: fitted)",
    )
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    """Dispatch ``hpcnb perfmodel <command>``; return the exit code.

    Args:
        args: Parsed arguments with ``perfmodel_command`` naming the sub-command.
    """
    commands = {"validate-scaling": validate_scaling_command}
    command = getattr(args, "perfmodel_command", None)
    if command not in commands:
        print(f"error: unknown perfmodel command {command!r}", file=sys.stderr)
        return 2
    return commands[command](args)
