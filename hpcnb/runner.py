"""Batch execution of notebooks with papermill, collecting their records and claims.

Each notebook runs in its own ``papermill`` process (kernel ``python3``, working
directory ``notebooks/``) launched through :class:`hpcnb.launch.ProcessTree`, so that on a
timeout, on Ctrl-C or SIGTERM, or on an error of the runner, papermill, its kernel and
everything the kernel started (MPI ranks included) are stopped within seconds. Parameters
are validated against the notebook's ``parameters`` cell before any process starts. A
failing notebook is reported with its failing cell and the others still run; the
executed (possibly partial) notebook stays on disk. An interrupted run records the
notebook in flight as ``interrupted`` and keeps what finished.

A notebook whose inputs fingerprint (code, parameters, package, lock file, machine,
measurement environment: thread and BLAS variables and the libraries loaded; see
:mod:`hpcnb.runfolder`) and real-data files are unchanged since a successful run in a
sibling run folder is not executed again: that run's executed notebook and records are
re-used and reported as ``cached (from <run>)``, unless ``force`` is given. The re-used
notebook gets the current notebook's markdown cells (:func:`splice_text`), so edited prose
reaches the new run folder.

Output layout of a run folder::

    <out>/<stem>.ipynb     executed notebooks
    <out>/records.json         {"<stem>": {key: value, ...}, ...}
    <out>/records_detail.json  {"<stem>": {key: {value, unit, target, paper, n, low, high,
                                                 source, met}}}
    <out>/claims.json          {"<stem>": [{claim, kind, paper, measured, verdict, records}]}
    <out>/run.json             {"<stem>": {"status", "seconds", "error", "cell", "parameters",
                                           "output" (relative), "inputs_key", "data",
                                           "cached_from", "machine", "environment",
                                           "inputs"}}

Earlier successful runs of the same notebook with the same parameters on the same machine,
found in sibling run folders, are passed to the kernel (:mod:`hpcnb.history`), so its claims
table shows the values of records that moved between runs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from hpcnb.claims import SMOKE_ENV, read_claims
from hpcnb.errors import HpcnbError, InvalidInputError
from hpcnb.history import HISTORY_ENV, earlier_runs, write_history
from hpcnb.launch import InterruptedRunError, ProcessTree, sigterm_as_interrupt
from hpcnb.parameters import (
    ParameterError,
    notebook_parameters,
    read_notebook,
    validate_overrides,
)
from hpcnb.paths import machine_key
from hpcnb.records import MET, read_record_details
from hpcnb.runfolder import (
    RUN_FILES,
    RunFolderError,
    find_cached,
    held_lock_fd,
    inputs_parts,
    key_of,
    locked_run_folder,
    measurement_environment,
    read_run_tables,
    unique_run_folder,
    write_json_atomic,
)

__all__ = [
    "NotebookResult",
    "NOTEBOOKS_ENV",
    "NotebooksNotFoundError",
    "check_timeout",
    "copy_notebooks",
    "default_notebooks",
    "execute_notebook",
    "notebooks_dir",
    "packaged_notebooks_dir",
    "prepare",
    "resolve_notebook",
    "run_notebooks",
    "splice_text",
    "timestamped_dir",
    "write_run",
]

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_TIMEOUT = "timeout"
STATUS_INTERRUPTED = "interrupted"


@dataclass
class NotebookResult:
    """Outcome of one executed notebook.

    Attributes:
        notebook: Stem of the notebook (``"00_tour"``).
        status: ``"ok"``, ``"failed"``, ``"timeout"`` or ``"interrupted"``.
        seconds: Wall-clock duration.
        output: Path of the executed notebook.
        parameters: The parameters injected.
        records: ``{key: value}`` read from the executed notebook.
        details: ``{key: {value, unit, target, paper, n, low, high, source, met}}``.
        claims: The claims rows of the executed notebook.
        error: One-line description of the failure (exception and message).
        cell: Index (0-based) of the failing cell in the original notebook, if known.
        inputs_key: The inputs fingerprint (see :func:`hpcnb.runfolder.inputs_key`).
        data: Real-data lookups of the run, ``{logical name: sha256 or "missing"}``.
        cached_from: Name of the run folder whose result was re-used, else empty.
        machine: The machine key the notebook ran on (:func:`hpcnb.paths.machine_key`).
        environment: The measurement environment of the run
            (:func:`hpcnb.runfolder.measurement_environment`).
        inputs: The other parts of the fingerprint (:func:`hpcnb.runfolder.inputs_parts`:
            code, parameters, package, lock, machine), for ``hpcnb status``.
    """

    notebook: str
    status: str
    seconds: float
    output: str
    parameters: dict[str, Any] = field(default_factory=dict)
    records: dict[str, float] = field(default_factory=dict)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    cell: int | None = None
    inputs_key: str = ""
    data: dict[str, str] = field(default_factory=dict)
    cached_from: str = ""
    machine: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the notebook ran to completion."""
        return self.status == STATUS_OK


#: Environment variable naming a folder of notebooks that replaces every other place.
NOTEBOOKS_ENV = "HPCNB_NOTEBOOKS"


class NotebooksNotFoundError(HpcnbError, FileNotFoundError):
    """No folder of notebooks could be found, or ``HPCNB_NOTEBOOKS`` names no folder."""


class OutputClashError(HpcnbError, FileExistsError):
    """An output folder or notebook is in the way (a file, the source folder, an earlier run)."""


def packaged_notebooks_dir() -> Path | None:
    """Return the copy of the notebooks shipped inside the installed wheel, if any.

    A wheel carries the notebooks as package data in ``hpcnb/_notebooks/``; a source
    checkout (editable install included) has no such folder.
    """
    folder = Path(__file__).resolve().parent / "_notebooks"
    return folder if folder.is_dir() else None


def _source_tree_notebooks() -> Path | None:
    """Return ``notebooks/`` of the source tree this package is imported from, if any."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "notebooks"
    if folder.is_dir() and (root / "pyproject.toml").is_file():
        return folder
    return None


def notebooks_dir() -> Path:
    """Return the folder the notebooks are read from.

    The first of: the folder named by ``HPCNB_NOTEBOOKS``; the ``notebooks/`` folder of
    the source tree when hpcnb is imported from a checkout (an editable install); the
    copy shipped inside the installed package (``hpcnb notebooks DIR`` copies it out).

    Raises:
        NotebooksNotFoundError: ``HPCNB_NOTEBOOKS`` names no folder, or none of the places
            has notebooks.
    """
    value = os.environ.get(NOTEBOOKS_ENV)
    if value:
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise NotebooksNotFoundError(f"{NOTEBOOKS_ENV}={value}: no such folder")
        return folder
    for found in (_source_tree_notebooks(), packaged_notebooks_dir()):
        if found is not None:
            return found
    raise NotebooksNotFoundError(
        f"no notebooks found: set {NOTEBOOKS_ENV} to a folder of notebooks, "
        "or install hpcnb from its wheel, which ships them"
    )


def default_notebooks() -> list[Path]:
    """Return every ``*.ipynb`` of :func:`notebooks_dir` in name order."""
    return sorted(notebooks_dir().glob("*.ipynb"))


def copy_notebooks(target: str | Path, *, force: bool = False) -> list[Path]:
    """Copy the notebooks of :func:`notebooks_dir` into ``target`` (created if missing).

    Args:
        target: The folder to copy into.
        force: Overwrite notebooks already in ``target``.

    Returns:
        The paths written, in name order.

    Raises:
        NotebooksNotFoundError: There are no notebooks to copy.
        FileExistsError: ``target`` is a file, or (without ``force``) already holds a
            notebook of the same name; nothing is copied then.
    """
    sources = default_notebooks()
    if not sources:
        raise NotebooksNotFoundError(f"{notebooks_dir()}: no notebooks to copy")
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise OutputClashError(f"{target}: exists and is not a folder")
    if target.resolve() == sources[0].parent.resolve():
        raise OutputClashError(f"{target}: is the folder the notebooks are read from")
    if not force:
        clashes = [target / src.name for src in sources if (target / src.name).exists()]
        if clashes:
            more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
            raise OutputClashError(f"{clashes[0]}: already exists{more}; use --force to overwrite")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources:
        dest = target / src.name
        shutil.copyfile(src, dest)
        written.append(dest)
    return written


def timestamped_dir(root: str | Path = "papermill_runs") -> Path:
    """Create and return a new empty run folder ``root/<UTC timestamp>``.

    Two runs started in the same second get two folders (``...Z`` and ``...Z-2``; see
    :func:`hpcnb.runfolder.unique_run_folder`).

    Raises:
        RunFolderError: ``root`` cannot be created or written.
    """
    return unique_run_folder(root, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))


def prepare(
    notebooks: Sequence[str | Path], overrides: dict[str, Any], smoke: bool = False
) -> list[tuple[Path, dict[str, Any]]]:
    """Resolve notebooks and validate parameters for each, before anything runs.

    Args:
        notebooks: Notebook paths or stems (``"00_tour"``); empty means all.
        overrides: Name → value; strings are parsed per the declared type.
        smoke: Add ``SMOKE=True``.

    Returns:
        ``(path, typed parameters)`` per notebook.

    Raises:
        FileNotFoundError: A notebook does not exist.
        ParameterError: An override is unknown or ill-typed for some notebook.
    """
    paths = [resolve_notebook(nb) for nb in notebooks] if notebooks else default_notebooks()
    if not paths:
        raise NotebooksNotFoundError("no notebooks to run")
    wanted = dict(overrides)
    if smoke:
        wanted["SMOKE"] = True
    return [(path, validate_overrides(notebook_parameters(path), wanted, path)) for path in paths]


def resolve_notebook(notebook: str | Path) -> Path:
    """Return the notebook file of a path or a stem (``"00_tour"`` in :func:`notebooks_dir`).

    Raises:
        FileNotFoundError: No such notebook.
    """
    path = Path(notebook)
    if path.suffix != ".ipynb":
        path = notebooks_dir() / f"{path.name}.ipynb"
    if not path.is_file():
        raise NotebooksNotFoundError(f"{notebook}: no such notebook")
    return path.resolve()


def _failure(output: Path) -> tuple[str, int | None]:
    """Return (error line, cell index) of the failing cell of an executed notebook.

    The index counts the cells of the original notebook (0-based, markdown included),
    skipping the cells papermill inserts (injected parameters, error banners).
    """
    try:
        nb = json.loads(output.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return "", None
    index = -1
    for cell in nb.get("cells", []):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if tags & {"injected-parameters", "papermill-error-cell-tag"}:
            continue
        index += 1
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}", index
    return "", None


def check_timeout(timeout: float | None) -> float | None:
    """Return ``timeout`` if it is ``None`` or a finite positive number of seconds.

    Raises:
        ParameterError: Otherwise (NaN, infinity, zero, negative, not a number).
    """
    if timeout is None:
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise ParameterError(f"--timeout {timeout!r}: not a number of seconds") from None
    if not math.isfinite(value) or value <= 0 or value > 1e7:
        raise ParameterError(
            f"--timeout {timeout!r}: need a finite positive number of seconds (at most 1e7)"
        )
    return value


def _read_data_log(path: Path) -> dict[str, str]:
    states: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, state = line.partition("\t")
            if name and state:
                states[name] = state
    return states


def _collect(output: Path, status: str, error: str) -> tuple[str, str, dict[str, Any]]:
    """Read records and claims of an executed notebook; a malformed one fails the run."""
    found: dict[str, Any] = {"records": {}, "details": {}, "claims": []}
    if not output.exists():
        return status, error, found
    try:
        recs = read_record_details(output)
        found["records"] = {rec.key: rec.value for rec in recs}
        found["details"] = {rec.key: rec.detail() for rec in recs}
        found["claims"] = read_claims(output)
    except (HpcnbError, ValueError, TypeError, KeyError) as exc:
        if status == STATUS_OK:
            status, error = STATUS_FAILED, f"malformed output: {exc}"
    return status, error, found


#: papermill's command line with the kernel on IPC (Unix domain) sockets in a private
#: temporary folder instead of TCP ports on localhost: nothing is sent over TCP, so
#: ipykernel's "Kernel is running over TCP without encryption" warning has no cause.
#: Where Unix sockets are missing (Windows), the kernel keeps jupyter_client's TCP default.
#: papermill's own reading of the parameters cell misses ``Literal[...]`` annotations and
#: would warn "Passed unknown parameter" for them; every name was checked against the cell
#: before papermill starts, so that warning is dropped.
_PAPERMILL_IPC = """
import atexit, logging, os, shutil, sys, tempfile
from papermill.cli import papermill
from papermill.engines import NBClientEngine, papermill_engines
from traitlets.config import Config

class IPCEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        config = Config()
        if os.name == "posix":
            folder = tempfile.mkdtemp(prefix="hpcnb-ipc-")
            atexit.register(shutil.rmtree, folder, True)
            config.KernelManager.transport = "ipc"
            config.KernelManager.ip = os.path.join(folder, "kernel")
        return super().execute_managed_notebook(nb_man, kernel_name, config=config, **kwargs)

class _CheckedNames(logging.Filter):
    def filter(self, record):
        return not record.getMessage().startswith("Passed unknown parameter")

logging.getLogger("papermill").addFilter(_CheckedNames())
papermill_engines.register("hpcnb-ipc", IPCEngine)
papermill(sys.argv[1:] + ["--engine", "hpcnb-ipc"], prog_name="papermill")
"""


def execute_notebook(
    path: str | Path,
    output: str | Path,
    parameters: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,
    progress: bool = True,
    cwd: str | Path | None = None,
    history: str | Path | None = None,
) -> NotebookResult:
    """Execute one notebook with papermill; stop it and all it started on any exit.

    Args:
        path: The notebook.
        output: Where the executed notebook is written.
        parameters: Already validated parameters to inject.
        timeout: Wall-clock limit in seconds for the whole notebook (also the cell limit).
        progress: Show papermill's progress bar on stderr.
        cwd: Working directory of the kernel (default: the notebook's folder).
        history: A record-history file (:func:`hpcnb.history.write_history`) the kernel's
            claims table shows beside each record that moved between runs.

    Returns:
        The :class:`NotebookResult`; failures are reported, not raised. On Ctrl-C or
        SIGTERM the processes are stopped and a result with status ``"interrupted"`` is
        returned (the caller decides whether to go on).

    Raises:
        ParameterError: ``timeout`` is not a finite positive number.
    """
    timeout = check_timeout(timeout)
    path = Path(path)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    parameters = dict(parameters or {})
    # Parameters travel in a file, not on the command line: a large value would pass the
    # kernel's limit on one argument ("Argument list too long").
    params_fd, params_name = tempfile.mkstemp(prefix="hpcnb-params-", suffix=".yaml")
    with os.fdopen(params_fd, "w", encoding="utf-8") as handle:
        yaml.safe_dump(parameters, handle, default_flow_style=False, allow_unicode=True)
    cmd = [
        sys.executable,
        "-c",
        _PAPERMILL_IPC,
        str(path),
        str(output),
        "-k",
        "python3",
        "--cwd",
        str(Path(cwd) if cwd else path.parent),
        "-f",
        params_name,
        "--progress-bar" if progress else "--no-progress-bar",
        "--log-level",
        "WARNING",
    ]
    if timeout is not None:
        cmd += ["--execution-timeout", str(int(max(1, timeout)))]
    log_fd, log_name = tempfile.mkstemp(prefix="hpcnb-data-", suffix=".log")
    os.close(log_fd)
    data_log = Path(log_name)
    try:
        return _execute(path, output, parameters, cmd, data_log, timeout, progress, history)
    finally:
        data_log.unlink(missing_ok=True)
        Path(params_name).unlink(missing_ok=True)


def _execute(
    path: Path,
    output: Path,
    parameters: dict[str, Any],
    cmd: list[str],
    data_log: Path,
    timeout: float | None,
    progress: bool,
    history: str | Path | None,
) -> NotebookResult:
    """Run papermill's command line ``cmd`` as a process family; collect the result."""
    env = dict(os.environ)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    env["HPCNB_DATA_LOG"] = str(data_log)
    env["HPCNB_BATCH"] = "1"  # notebooks keep progress bars quiet under the runner
    env.pop(HISTORY_ENV, None)
    env.pop(SMOKE_ENV, None)
    if parameters.get("SMOKE") is True:  # paper claims read "not tested (smoke inputs)"
        env[SMOKE_ENV] = "1"
    if history is not None:
        env[HISTORY_ENV] = str(history)
    start = time.perf_counter()
    status, error, cell = STATUS_OK, "", None
    stdout = stderr = ""
    lock = held_lock_fd(output.parent)
    tree = ProcessTree(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        text=True,
        watchdog=True,  # the family dies with this process, even on SIGKILL
        hold_fds=() if lock is None else (lock,),
    )
    try:
        stdout, stderr = tree.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        status, error = STATUS_TIMEOUT, f"timed out after {timeout:g} s"
    except KeyboardInterrupt:
        status, error = STATUS_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)"
    finally:
        tree.stop()  # the kernel and its children too, whatever happened
    seconds = time.perf_counter() - start
    if status == STATUS_OK and tree.proc.returncode != 0:
        status = STATUS_FAILED
        error, cell = _failure(output)
        if not error:
            tail = (stderr or stdout or "").strip().splitlines()
            error = tail[-1] if tail else f"papermill exited with status {tree.proc.returncode}"
    if output.exists() and not _is_notebook_file(output):
        # papermill could not finish writing it (a full disk, a file-size limit): a
        # truncated notebook is no result, so it goes and the run says why.
        output.unlink(missing_ok=True)
        status = STATUS_FAILED
        tail = (stderr or stdout or "").strip().splitlines()
        reason = tail[-1] if tail else error or "papermill stopped while writing it"
        error, cell = f"the executed notebook could not be written (removed): {reason}", None
    status, error, found = _collect(output, status, error)
    data = _read_data_log(data_log)
    return NotebookResult(
        notebook=path.stem,
        status=status,
        seconds=seconds,
        output=str(output),
        parameters=parameters,
        records=found["records"],
        details=found["details"],
        claims=found["claims"],
        error=error,
        cell=cell,
        data=data,
        machine=machine_key(),
    )


def _is_notebook_file(path: Path) -> bool:
    """Whether ``path`` holds a whole notebook (:func:`hpcnb.parameters.read_notebook`)."""
    try:
        read_notebook(path)
    except ParameterError:
        return False
    return True


def write_run(out: str | Path, results: Iterable[NotebookResult]) -> None:
    """Write the JSON files of a run folder, merging with what is there.

    Writes ``records.json``, ``records_detail.json``, ``claims.json`` and ``run.json``,
    each atomically and as strict JSON (non-finite numbers are refused). ``run.json``
    stores each executed notebook's path relative to the folder.

    Args:
        out: The run folder.
        results: Results of the notebooks run (merged by notebook name).

    Raises:
        RunFolderError: An existing file of the folder is corrupt, or a file cannot be
            written (a full disk, a read-only folder); files already there stay whole.
    """
    out = Path(out)
    tables = read_run_tables(out)
    for result in results:
        tables["records.json"][result.notebook] = result.records
        tables["records_detail.json"][result.notebook] = result.details
        tables["claims.json"][result.notebook] = result.claims
        info = asdict(result)
        for name in ("records", "details", "claims"):
            info.pop(name)
        info["output"] = Path(result.output).name
        tables["run.json"][result.notebook] = info
    for name in RUN_FILES:
        try:
            write_json_atomic(out / name, tables[name])
        except OSError as exc:
            raise RunFolderError(
                f"{out / name}: cannot be written ({exc.strerror or exc}); the folder keeps "
                "the files of the notebooks before"
            ) from None


def summary_line(index: int, total: int, result: NotebookResult) -> str:
    """Return the progress line of a finished notebook.

    Example: ``[3/9] 02_gnn_rl_pruning ok in 3.4 min (12 records, 9 of 10 targets met)``.

    Args:
        index: Position of the notebook in the run (1-based).
        total: Number of notebooks in the run.
        result: The notebook's result.
    """
    minutes = result.seconds / 60
    took = f"{minutes:.1f} min" if minutes >= 1 else f"{result.seconds:.1f} s"
    head = f"[{index}/{total}] {result.notebook}"
    if result.cached_from:
        head += f" cached (from {result.cached_from})"
    else:
        head += f" {result.status} in {took}"
    states = [d.get("met") for d in result.details.values() if d.get("met")]
    tested = [s for s in states if s != "not tested"]
    text = f"{head} ({len(result.records)} records, {sum(s == MET for s in tested)} of "
    text += f"{len(tested)} targets met)"
    if not result.ok:
        where = f" at cell {result.cell}" if result.cell is not None else ""
        text += f"{where}: {result.error}"
    return text


_PAPERMILL_TAGS = {"injected-parameters", "papermill-error-cell-tag"}


def splice_text(executed: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Return ``executed`` with the markdown and raw cells (and cell order) of ``current``.

    A re-used result has the same code cells as the current notebook (the inputs
    fingerprint hashes them) but its prose may have been edited since: the spliced
    notebook keeps every executed code cell with its outputs, in order, and takes every
    other cell from ``current``; papermill's injected-parameters cell stays right after the
    cell tagged ``parameters``.

    Args:
        executed: The executed notebook (outputs kept).
        current: The notebook as it is now (prose taken).

    Raises:
        ValueError: The two notebooks do not have the same code cells.
    """

    def tags(cell: dict[str, Any]) -> set[str]:
        return set(cell.get("metadata", {}).get("tags", []))

    injected = [c for c in executed.get("cells", []) if "injected-parameters" in tags(c)]
    code = [
        c
        for c in executed.get("cells", [])
        if c.get("cell_type") == "code" and not tags(c) & _PAPERMILL_TAGS
    ]
    wanted = [c for c in current.get("cells", []) if c.get("cell_type") == "code"]
    if [_source(c) for c in code] != [_source(c) for c in wanted]:
        raise InvalidInputError("the executed notebook's code cells differ from the notebook's")
    cells: list[dict[str, Any]] = []
    run = iter(code)
    for cell in current.get("cells", []):
        cells.append(next(run) if cell.get("cell_type") == "code" else cell)
        if "parameters" in tags(cell):
            cells += injected
    return {**executed, "cells": cells}


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _copy_with_current_text(executed: Path, notebook: Path, target: Path) -> None:
    """Write the re-used ``executed`` notebook to ``target`` with ``notebook``'s prose."""
    try:
        spliced = splice_text(
            json.loads(executed.read_text(encoding="utf-8")),
            json.loads(notebook.read_text(encoding="utf-8")),
        )
        write_json_atomic(target, spliced, indent=1, sort_keys=False)
    except (OSError, ValueError):  # unreadable or not the same code: keep the run as it is
        if executed.resolve() != target.resolve():
            shutil.copy2(executed, target)


def _reuse(path: Path, folder: Path, cached: tuple[Path, dict[str, Any]]) -> NotebookResult:
    source, info = cached
    executed = source / Path(str(info["output"])).name
    target = folder / path.name
    _copy_with_current_text(executed, path, target)
    status, error, found = _collect(target, STATUS_OK, "")
    return NotebookResult(
        notebook=path.stem,
        status=status,
        seconds=float(info.get("seconds", 0.0)),
        output=str(target),
        parameters=dict(info.get("parameters") or {}),
        records=found["records"],
        details=found["details"],
        claims=found["claims"],
        error=error,
        inputs_key=str(info.get("inputs_key", "")),
        data=dict(info.get("data") or {}),
        cached_from=source.name,
        machine=str(info.get("machine", "")),
        environment=dict(info.get("environment") or {}),
        inputs=dict(info.get("inputs") or {}),
    )


def _execute_with_history(
    path: Path,
    folder: Path,
    search: Path,
    params: dict[str, Any],
    timeout: float | None,
    progress: bool,
) -> NotebookResult:
    """Execute ``path`` into ``folder``, passing the kernel its earlier comparable runs."""
    runs = earlier_runs(search, path.stem, machine=machine_key(), parameters=params, exclude=folder)
    if not runs:
        return execute_notebook(
            path, folder / path.name, params, timeout=timeout, progress=progress
        )
    fd, name = tempfile.mkstemp(prefix="hpcnb-history-", suffix=".json")
    os.close(fd)
    try:
        write_history(name, runs)
        return execute_notebook(
            path, folder / path.name, params, timeout=timeout, progress=progress, history=name
        )
    finally:
        Path(name).unlink(missing_ok=True)


def run_notebooks(
    notebooks: Sequence[str | Path] = (),
    overrides: dict[str, Any] | None = None,
    *,
    smoke: bool = False,
    out: str | Path | None = None,
    timeout: float | None = None,
    progress: bool = True,
    resume: bool = False,
    force: bool = False,
    cache_root: str | Path | None = None,
    on_result: Callable[[int, int, NotebookResult], None] | None = None,
) -> list[NotebookResult]:
    """Validate, then execute notebooks one after another into a run folder.

    Args:
        notebooks: Paths or stems; empty means every notebook in ``notebooks/``.
        overrides: Parameter values for every notebook.
        smoke: Run with ``SMOKE=True``.
        out: Run folder (default ``papermill_runs/<UTC timestamp>``); must be empty or
            absent unless ``resume``.
        timeout: Per-notebook wall-clock limit in seconds (finite, positive).
        progress: Show a progress bar per notebook.
        resume: Continue the run in ``out``: notebooks already ``ok`` there with the same
            inputs fingerprint are skipped.
        force: Execute every notebook even when an earlier result could be re-used.
        cache_root: Folder of earlier run folders searched for re-usable results
            (default: the parent of ``out``).
        on_result: Called with ``(index, total, result)`` as each notebook ends (see
            :func:`summary_line`).

    Returns:
        One result per notebook, in order; the run folder's JSON files are written after
        each notebook, so partial runs keep what finished.

    Raises:
        ParameterError: Before anything runs, when a parameter or the timeout is bad.
        RunFolderError: The run folder is not empty, in use, or corrupt.
        InterruptedRunError: Ctrl-C or SIGTERM; the notebook in flight is recorded as
            ``interrupted`` and every process it started is stopped.
    """
    timeout = check_timeout(timeout)
    plan = prepare(notebooks, overrides or {}, smoke=smoke)
    out_dir = Path(out) if out is not None else timestamped_dir()
    search = Path(cache_root) if cache_root is not None else out_dir.parent
    results = []
    with locked_run_folder(out_dir, resume=resume) as folder, sigterm_as_interrupt():
        done = read_run_tables(folder)["run.json"] if resume else {}
        environment = measurement_environment()
        for index, (path, params) in enumerate(plan, 1):
            parts = inputs_parts(path, params, environment)
            key = key_of(parts)
            previous = done.get(path.stem)
            cached = None
            if (
                isinstance(previous, dict)
                and previous.get("status") == STATUS_OK
                and previous.get("inputs_key") == key
                and (folder / str(previous.get("output", ""))).is_file()
            ):
                cached = (folder, previous)
            elif not force:
                cached = find_cached(path.stem, key, search, exclude=folder)
            if cached is not None:
                result = _reuse(path, folder, cached)
            else:
                result = _execute_with_history(path, folder, search, params, timeout, progress)
                result.inputs_key = key
                result.environment = environment
                result.inputs = {k: v for k, v in parts.items() if k != "environment"}
            if cached is not None and cached[0] == folder and isinstance(previous, dict):  # resumed
                result.cached_from = str(previous.get("cached_from", ""))
            results.append(result)
            write_run(folder, [result])
            if on_result is not None:
                on_result(index, len(plan), result)
            if result.status == STATUS_INTERRUPTED:
                raise InterruptedRunError(
                    f"run interrupted during {path.stem}; {folder} keeps what finished"
                )
    return results
