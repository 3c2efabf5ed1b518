"""The ``hpcnb`` command: list, run, sweep and report notebooks; technique tools.

Sub-commands::

    hpcnb list
    hpcnb notebooks DIR [--force]
    hpcnb run [NOTEBOOK...] [-p NAME VALUE]... [--smoke] [--out DIR] [--timeout S]
              [--resume] [--force]
    hpcnb sweep NOTEBOOK --grid GRID.yaml [--workers N] [--scheduler ADDRESS] [--out DIR]
    hpcnb report RUN_DIR
    hpcnb status [NOTEBOOK...] [-p NAME VALUE]... [--smoke] [--runs DIR]
    hpcnb diff RUN_A RUN_B
    hpcnb site RUN_DIR [--out DIR]
    hpcnb strip [NOTEBOOK...]
    hpcnb data list | fetch [NAME...|--all] | verify

Technique packages add their own sub-commands (``hpcnb batchsim ...``,
``hpcnb perfmodel ...``) through a ``register(subparsers)`` function in their
``cli`` module, listed in :data:`TECHNIQUE_CLIS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hpcnb.argtypes import whole_number
from hpcnb.errors import HpcnbError
from hpcnb.parameters import ParameterError, notebook_parameters
from hpcnb.records import format_record, read_record_details

__all__ = ["TECHNIQUE_CLIS", "build_parser", "main", "strip_notebook"]

#: Default of ``hpcnb sweep --max-points`` (the same as :data:`hpcnb.sweep.MAX_POINTS`;
#: not imported from there, which would load pandas for every command).
_MAX_POINTS = 1000

#: Technique sub-commands: name -> (module with ``register(subparsers)``, one-line help).
#: A module is imported only when its sub-command is used (they import torch), so that
#: ``hpcnb run`` rejects a bad parameter in a fraction of a second.
TECHNIQUE_CLIS: dict[str, tuple[str, str]] = {
    "data": ("hpcnb.data.cli", "list, fetch and verify the real data of the registry"),
    "batchsim": ("hpcnb.batchsim.cli", "ElastiSim-style batch-system simulation"),
    "perfmodel": ("hpcnb.perfmodel.cli", "ConvMeter performance-model tools"),
    "commprof": ("hpcnb.commprof.cli", "communication profiles of unmodified C programs"),
}


def _cmd_list(args: argparse.Namespace) -> int:
    from hpcnb.runner import default_notebooks

    try:
        paths = default_notebooks()
    except FileNotFoundError as exc:
        print(f"hpcnb list: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        try:
            params = notebook_parameters(path)
        except ParameterError as exc:
            print(f"hpcnb list: warning: skipped {exc}", file=sys.stderr)
            continue
        print(path.stem)
        for p in params:
            print(f"    {p.name}: {p.type} = {p.default!r}  # {p.comment}")
    return 0


def _cmd_notebooks(args: argparse.Namespace) -> int:
    from hpcnb.runner import copy_notebooks

    try:
        written = copy_notebooks(args.dir, force=args.force)
    except OSError as exc:
        print(f"hpcnb notebooks: {exc}", file=sys.stderr)
        return 2
    print(f"copied {len(written)} notebook(s) into {args.dir}")
    return 0


def _print_result(index: int, total: int, result: object) -> None:
    from hpcnb.runner import summary_line

    print(summary_line(index, total, result), flush=True)  # type: ignore[arg-type]
    _print_records_table([result])


def _print_records_table(results: Sequence[object]) -> None:
    for result in results:
        details = []
        output = Path(result.output)  # type: ignore[attr-defined]
        if output.exists():
            try:
                details = read_record_details(output)
            except ValueError as exc:
                print(f"{result.notebook}: records unreadable: {exc}")  # type: ignore[attr-defined]
        for rec in details:
            print(f"  {format_record(rec)}")


def _cmd_run(args: argparse.Namespace) -> int:
    from hpcnb.launch import InterruptedRunError
    from hpcnb.report import render_report
    from hpcnb.runfolder import RunFolderError
    from hpcnb.runner import check_timeout, prepare, run_notebooks, timestamped_dir

    overrides = dict(args.param or [])
    try:
        timeout = check_timeout(args.timeout)
        plan = prepare(args.notebooks, overrides, smoke=args.smoke)
    except (ParameterError, FileNotFoundError) as exc:
        print(f"hpcnb run: {exc}", file=sys.stderr)
        return 2
    try:
        out = Path(args.out) if args.out else timestamped_dir()
    except RunFolderError as exc:
        print(f"hpcnb run: {exc}", file=sys.stderr)
        return 2
    print(f"running {len(plan)} notebook(s) into {out}", flush=True)
    status = 0
    try:
        results = run_notebooks(
            args.notebooks,
            overrides,
            smoke=args.smoke,
            out=out,
            timeout=timeout,
            progress=not args.no_progress,
            resume=args.resume,
            force=args.force,
            on_result=_print_result,
        )
        status = 0 if all(r.ok for r in results) else 1
    except RunFolderError as exc:
        print(f"hpcnb run: {exc}", file=sys.stderr)
        return 2
    except InterruptedRunError as exc:
        print(f"hpcnb run: {exc}", file=sys.stderr)
        status = 130
    except KeyboardInterrupt:
        print("hpcnb run: interrupted", file=sys.stderr)
        status = 130
    if (out / "run.json").is_file():
        try:
            (out / "report.md").write_text(render_report(out), encoding="utf-8")
        except (OSError, HpcnbError) as exc:
            print(f"hpcnb run: report.md not written: {exc}", file=sys.stderr)
            return status or 1
        print(f"\nrun folder: {out}\nreport: {out / 'report.md'}")
    return status


#: Options of ``hpcnb sweep`` passed to :func:`hpcnb.sweep.sweep` under the same names.
_SWEEP_OPTIONS = ("workers", "scheduler", "out", "smoke", "timeout", "max_points")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from hpcnb.launch import InterruptedRunError
    from hpcnb.sweep import load_grid, sweep

    try:
        grid = load_grid(args.grid)
        options = {name: getattr(args, name) for name in _SWEEP_OPTIONS}
        table = sweep(args.notebook, grid, **options)
    except InterruptedRunError as exc:
        print(f"hpcnb sweep: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("hpcnb sweep: interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, HpcnbError) as exc:
        print(f"hpcnb sweep: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False))
    folder = Path(table.attrs["run_folder"])
    print(f"\nrun folder: {folder}\nreport: {folder / 'report.md'}")
    return 0 if (table["status"] == "ok").all() else 1


def _cmd_strip(args: argparse.Namespace) -> int:
    from hpcnb.runner import default_notebooks

    paths = [Path(p) for p in args.notebooks] or default_notebooks()
    for path in paths:
        if strip_notebook(path):
            print(f"stripped {path}")
    return 0


def strip_notebook(path: str | Path) -> bool:
    """Clear outputs and execution counts of a notebook in place, keeping cell tags.

    Returns:
        Whether the file changed.
    """
    import nbformat

    path = Path(path)
    before = path.read_text(encoding="utf-8")
    nb = nbformat.reads(before, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    nb.metadata.pop("papermill", None)
    after = nbformat.writes(nb) + "\n"
    if after != before:
        path.write_text(after, encoding="utf-8")
        return True
    return False


def _print_markdown(command: str, render: Callable[[], str]) -> int:
    """Print what ``render`` returns; a missing or corrupt run folder is one line, exit 2."""
    try:
        print(render(), end="")
    except (FileNotFoundError, HpcnbError) as exc:
        print(f"hpcnb {command}: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from hpcnb.report import render_report

    return _print_markdown("report", lambda: render_report(args.run_dir))


def _cmd_status(args: argparse.Namespace) -> int:
    from hpcnb.runner import prepare
    from hpcnb.status import notebook_status, render_status

    try:
        plan = prepare(args.notebooks, dict(args.param or []), smoke=args.smoke)
    except (ParameterError, FileNotFoundError) as exc:
        print(f"hpcnb status: {exc}", file=sys.stderr)
        return 2
    statuses = [notebook_status(path, params, args.runs) for path, params in plan]
    print(render_status(statuses), end="")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from hpcnb.rundiff import diff_runs, render_diff

    return _print_markdown("diff", lambda: render_diff(diff_runs(args.run_a, args.run_b)))


def _cmd_site(args: argparse.Namespace) -> int:
    from hpcnb.site import build_site

    try:
        index = build_site(args.run_dir, args.out)
    except HpcnbError as exc:
        print(f"hpcnb site: {exc}", file=sys.stderr)
        return 2
    print(f"site: {index}")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hpcnb")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        from hpcnb import __version__

        return __version__


def _add_notebooks_and_params(p: argparse.ArgumentParser, param_help: str) -> None:
    """Add the notebooks to act on and the repeatable ``-p NAME VALUE`` option."""
    p.add_argument("notebooks", nargs="*", help="notebook paths or stems (default: all)")
    p.add_argument(
        "-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"), help=param_help
    )


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``hpcnb run``."""
    p = sub.add_parser("run", help="execute notebooks with papermill")
    _add_notebooks_and_params(p, "set a parameter (repeatable; 'hpcnb list' shows them)")
    p.add_argument("--smoke", action="store_true", help="run with SMOKE=True (miniature inputs)")
    p.add_argument("--out", help="run folder (default: papermill_runs/<UTC timestamp>)")
    p.add_argument(
        "--timeout", default=None, help="seconds per notebook, finite and > 0 (default: no limit)"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out: skip notebooks already ok there",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="execute even notebooks whose earlier result is unchanged",
    )
    p.set_defaults(func=_cmd_run)


def _add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``hpcnb sweep``."""
    p = sub.add_parser("sweep", help="run a notebook over a parameter grid on Dask")
    p.add_argument("notebook", help="notebook path or stem")
    p.add_argument(
        "--grid", required=True, help="YAML file mapping each parameter NAME to a list of values"
    )
    p.add_argument(
        "--workers",
        type=whole_number("--workers"),
        default=2,
        help="local Dask worker processes (default: %(default)s)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        help="address of an existing Dask scheduler, tcp://HOST:PORT "
        "(default: a local cluster of --workers processes)",
    )
    p.add_argument(
        "--out", default=None, help="run folder (default: papermill_runs/<UTC timestamp>)"
    )
    p.add_argument("--smoke", action="store_true", help="add SMOKE=True to every grid point")
    p.add_argument(
        "--timeout", default=None, help="seconds per grid point, finite and > 0 (default: no limit)"
    )
    p.add_argument(
        "--max-points",
        type=whole_number("--max-points"),
        default=_MAX_POINTS,
        help="largest number of grid points to run (default: %(default)s)",
    )
    p.set_defaults(func=_cmd_sweep)


def _add_status_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``hpcnb status``."""
    p = sub.add_parser(
        "status", help="which notebooks are stale against their newest run, and what changed"
    )
    _add_notebooks_and_params(p, "a parameter value a run now would use")
    p.add_argument("--smoke", action="store_true", help="compare with SMOKE=True runs")
    p.add_argument(
        "--runs", default="papermill_runs", help="folder of run folders (default: %(default)s)"
    )
    p.set_defaults(func=_cmd_status)


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser of the ``hpcnb`` command.

    Args:
        load: Name of the technique sub-command whose module is imported and whose full
            parser is built (see :data:`TECHNIQUE_CLIS`); the others are listed only.
    """
    parser = argparse.ArgumentParser(prog="hpcnb", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list notebooks and their parameters")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("notebooks", help="copy the notebooks into a folder to run or edit")
    p.add_argument("dir", help="folder to copy into (created if missing)")
    p.add_argument("--force", action="store_true", help="overwrite notebooks already there")
    p.set_defaults(func=_cmd_notebooks)

    _add_run_parser(sub)
    _add_sweep_parser(sub)

    p = sub.add_parser("strip", help="clear outputs and execution counts, keep cell tags")
    p.add_argument("notebooks", nargs="*", help="notebook files (default: all)")
    p.set_defaults(func=_cmd_strip)

    p = sub.add_parser("report", help="markdown summary of a run folder")
    p.add_argument("run_dir", help="a run folder written by 'hpcnb run' or 'hpcnb sweep'")
    p.set_defaults(func=_cmd_report)

    _add_status_parser(sub)

    p = sub.add_parser(
        "diff", help="records that moved beyond their intervals and verdicts that changed"
    )
    p.add_argument("run_a", help="the earlier run folder")
    p.add_argument("run_b", help="the later run folder")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser("site", help="static HTML pages of a run folder (no re-execution)")
    p.add_argument("run_dir", help="a folder written by 'hpcnb run'")
    p.add_argument("--out", default=None, help="site folder (default: RUN_DIR/site)")
    p.set_defaults(func=_cmd_site)

    for name, (module_name, help_text) in TECHNIQUE_CLIS.items():
        if name == load:
            importlib.import_module(module_name).register(sub)
        else:
            # Listed in --help; main() loads the real parser when the name is used.
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hpcnb`` command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    load = argv[0] if argv and argv[0] in TECHNIQUE_CLIS else None
    args = build_parser(load).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
