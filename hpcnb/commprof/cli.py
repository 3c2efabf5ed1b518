"""``hpcnb commprof ...``: communication profiles of unmodified programs from the command line.

Sub-command::

    hpcnb commprof profile [--out DIR] [--threads-hint T] [--word-bytes B]
        [--timeout S] [--max-log-mib M] -- PROGRAM [ARGS...]

runs ``PROGRAM ARGS`` (a pthreads or OpenMP executable built with ``-g``) under valgrind
(:mod:`hpcnb.commprof.valgrind`) and writes ``communication.csv``, ``objects.csv``,
``loops.csv`` and ``report.md`` into ``DIR`` (:mod:`hpcnb.commprof.report`). The run is
stopped once valgrind's log passes ``M`` MiB (default 256) or after ``S`` seconds. A
program without debug information, a missing tool or a failed run ends with exit status 2
and one line on stderr naming the problem.
"""

from __future__ import annotations

import argparse
import sys

from hpcnb.errors import HpcnbError

__all__ = ["profile_command", "register"]


def profile_command(args: argparse.Namespace) -> int:
    """Run ``hpcnb commprof profile``."""
    from hpcnb.commprof.report import write_outputs
    from hpcnb.commprof.valgrind import profile_program

    if not args.max_log_mib > 0:
        print(
            f"hpcnb commprof profile: --max-log-mib {args.max_log_mib:g}: expected a positive size",
            file=sys.stderr,
        )
        return 2

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "hpcnb commprof profile: no program given (… profile -- PROGRAM ARGS)", file=sys.stderr
        )
        return 2
    try:
        pp = profile_program(
            command,
            threads_hint=args.threads_hint,
            word_bytes=args.word_bytes,
            timeout=args.timeout,
            max_log_bytes=max(1, int(args.max_log_mib * (1 << 20))),
        )
        folder = write_outputs(pp, args.out, threads_hint=args.threads_hint)
    except (HpcnbError, OSError) as exc:
        print(f"hpcnb commprof profile: {exc}", file=sys.stderr)
        return 2
    print(
        f"{pp.nthreads} threads, {int(pp.matrix().sum())} communicated words; "
        f"wrote {folder}/{{communication.csv,objects.csv,loops.csv,report.md}}"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``commprof`` and its sub-commands to the ``hpcnb`` parser."""
    from hpcnb.commprof.valgrind import MAX_LOG_BYTES

    p = subparsers.add_parser("commprof", help="communication profiles of real programs")
    sub = p.add_subparsers(dest="commprof_command", required=True)
    q = sub.add_parser("profile", help="profile an unmodified -g program under valgrind")
    q.add_argument("--out", default="commprof_out", help="output folder (default: %(default)s)")
    q.add_argument(
        "--threads-hint",
        type=int,
        default=None,
        help="expected threads, main included (matrix size; mismatch reported; "
        "default: none expected, the threads that ran)",
    )
    q.add_argument(
        "--word-bytes", type=int, default=8, help="shadow word size in bytes (default: %(default)s)"
    )
    q.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="valgrind time limit in seconds (default: %(default)s)",
    )
    q.add_argument(
        "--max-log-mib",
        type=float,
        default=MAX_LOG_BYTES / (1 << 20),
        help="stop valgrind once its log passes this many MiB (default: %(default)g)",
    )
    q.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    q.set_defaults(func=profile_command)
