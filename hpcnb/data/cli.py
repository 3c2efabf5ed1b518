"""``hpcnb data ...``: list, fetch and verify the real data of the registry.

::

    hpcnb data list                        name, size, licence, where found
    hpcnb data fetch NAME... | --all [--quiet] [--timeout S]
    hpcnb data verify                      exit 1 when a local copy is corrupt

``list`` shows the registry's large files (the CIFAR-10 archive) after the others;
``fetch --all`` leaves them out, ``fetch NAME`` takes their names too.

``fetch --all`` stops at the first network failure, so an offline machine spends one
timeout, not one per file; it then says once that notebooks use labelled synthetic
stand-ins and exits 0 with ``--quiet`` (as ``make run`` calls it), 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from hpcnb.data.registry import (
    ChecksumError,
    DataNotFoundError,
    DownloadError,
    available,
    fetch_all,
    large_files,
    registry,
    verify,
)

__all__ = ["handler", "register"]

OFFLINE_MESSAGE = "real data not reachable; notebooks use labelled synthetic stand-ins"


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need a finite positive number of seconds")
    return value


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = n / 1000
    for unit in ("KB", "MB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _list(args: argparse.Namespace) -> int:
    where = available()
    entries = registry()
    width = max(map(len, entries))
    for name, entry in sorted(entries.items()):
        print(f"{name:<{width}}  {_size(entry.size):>9}  {where[name]:<12}  {entry.licence}")
    missing = sum(w == "missing" for w in where.values())
    print(f"{len(entries)} files, {missing} missing; fetch with 'hpcnb data fetch --all'")
    large, where_large = large_files(), available(large=True)
    if large:
        print("\nlarge files, fetched only by name ('hpcnb data fetch NAME'), not by --all:")
        for name, entry in sorted(large.items()):
            print(f"{name}  {_size(entry.size):>9}  {where_large[name]:<12}  {entry.licence}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    if not args.all and not args.names:
        print("error: name files to fetch or give --all", file=sys.stderr)
        return 2
    names = None if args.all else args.names
    known = registry().keys() | large_files().keys()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        print(
            f"error: not in the registry: {', '.join(unknown)} (see 'hpcnb data list')",
            file=sys.stderr,
        )
        return 2
    done: list[str] = []

    def report(name: str, path: Path) -> None:
        done.append(name)
        if not args.quiet:
            print(f"{name}: {path}")

    try:
        fetch_all(names, timeout=args.timeout, progress=not args.quiet, on_file=report)
    except DownloadError as exc:
        print(f"{OFFLINE_MESSAGE} ({exc})" if args.quiet else f"error: {exc}", file=sys.stderr)
        return 0 if args.quiet else 1
    except (ChecksumError, DataNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{len(done)} files available")
    return 0


def _verify(args: argparse.Namespace) -> int:
    problems = verify()
    for name, problem in problems.items():
        print(f"{name}: {problem}")
    where = available()
    present = sum(not w.startswith(("missing", "corrupt")) for w in where.values())
    print(
        f"{present} files verified, {len(problems)} corrupt, "
        f"{sum(w == 'missing' for w in where.values())} missing"
    )
    return 1 if problems else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` sub-command (list, fetch, verify) to ``hpcnb``.

    Args:
        subparsers: The top-level parser's sub-parsers.
    """
    parser = subparsers.add_parser("data", help="list, fetch and verify the real data")
    inner = parser.add_subparsers(dest="data_command", required=True)
    inner.add_parser("list", help="registered files and large files: size, where found, licence")
    fetch = inner.add_parser("fetch", help="download registered files into the cache")
    fetch.add_argument(
        "names", nargs="*", metavar="NAME", help="logical names as 'hpcnb data list' shows them"
    )
    fetch.add_argument(
        "--all", action="store_true", help="every registered file except the large files"
    )
    fetch.add_argument(
        "--quiet",
        action="store_true",
        help="no progress; an unreachable network is a notice, not an error",
    )
    fetch.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        help="seconds per connection and read (default: %(default)s)",
    )
    inner.add_parser("verify", help="check local copies against the registry's sha256")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    """Dispatch ``hpcnb data <command>``; return the exit code."""
    commands = {"list": _list, "fetch": _fetch, "verify": _verify}
    try:
        return commands[args.data_command](args)
    except DataNotFoundError as exc:  # e.g. HPCNB_DATA names no folder
        print(f"error: {exc}", file=sys.stderr)
        return 2
