"""Batch execution of notebooks with papermill, collecting their records.

Each notebook runs in its own ``papermill`` process (kernel ``python3``, working
directory ``notebooks/``) in a new process group, so a notebook that overruns its
timeout is stopped together with its kernel. Parameters are validated against the
notebook's ``parameters`` cell before any process starts. A failing notebook is
reported with its failing cell and the others still run; the executed (possibly
partial) notebook stays on disk.

Output layout of a run folder::

    <out>/<stem>.ipynb     executed notebooks
    <out>/records.json         {"<stem>": {key: value, ...}, ...}
    <out>/records_detail.json  {"<stem>": {key: {value, unit, target, paper, n, low, high,
                                                 source, met}}}
    <out>/claims.json          {"<stem>": [{claim, kind, paper, measured, verdict, records}]}
    <out>/run.json             {"<stem>": {"status", "seconds", "error", "cell", "parameters"}}
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from hpcnb.claims import read_claims
from hpcnb.errors import HpcnbError
from hpcnb.parameters import notebook_parameters, validate_overrides
from hpcnb.records import read_record_details

__all__ = [
    "NotebookResult",
    "default_notebooks",
    "execute_notebook",
    "notebooks_dir",
    "prepare",
    "run_notebooks",
    "timestamped_dir",
    "write_run",
]

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_TIMEOUT = "timeout"


@dataclass
class NotebookResult:
    """Outcome of one executed notebook.

    Attributes:
        notebook: Stem of the notebook (``"00_tour"``).
        status: ``"ok"``, ``"failed"`` or ``"timeout"``.
        seconds: Wall-clock duration.
        output: Path of the executed notebook.
        parameters: The parameters injected.
        records: ``{key: value}`` read from the executed notebook.
        details: ``{key: {value, unit, target, paper, n, low, high, source, met}}``.
        claims: The claims rows of the executed notebook.
        error: One-line description of the failure (exception and message).
        cell: Index (0-based) of the failing cell in the original notebook, if known.
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

    @property
    def ok(self) -> bool:
        """Whether the notebook ran to completion."""
        return self.status == STATUS_OK


def notebooks_dir() -> Path:
    """Return the project's ``notebooks/`` folder.

    Looks in the current directory first, then beside the installed package (the
    repository layout of an editable install).

    Raises:
        FileNotFoundError: Neither place has a ``notebooks/`` folder.
    """
    candidates = [Path.cwd() / "notebooks", Path(__file__).resolve().parents[1] / "notebooks"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "no notebooks/ folder in the current directory or beside the hpcnb package; "
        "run from the repository root or name the notebooks"
    )


def default_notebooks() -> list[Path]:
    """Return every ``notebooks/*.ipynb`` in name order."""
    return sorted(notebooks_dir().glob("*.ipynb"))


def timestamped_dir(root: str | Path = "papermill_runs") -> Path:
    """Return ``root/<UTC timestamp>`` (not yet created)."""
    return Path(root) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


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
    paths = [_resolve(nb) for nb in notebooks] if notebooks else default_notebooks()
    if not paths:
        raise FileNotFoundError("no notebooks to run")
    wanted = dict(overrides)
    if smoke:
        wanted["SMOKE"] = True
    return [(path, validate_overrides(notebook_parameters(path), wanted, path)) for path in paths]


def _resolve(notebook: str | Path) -> Path:
    path = Path(notebook)
    if path.suffix != ".ipynb":
        path = notebooks_dir() / f"{path.name}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"{notebook}: no such notebook")
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


def execute_notebook(
    path: str | Path,
    output: str | Path,
    parameters: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,
    progress: bool = True,
    cwd: str | Path | None = None,
) -> NotebookResult:
    """Execute one notebook with papermill in its own process group.

    Args:
        path: The notebook.
        output: Where the executed notebook is written.
        parameters: Already validated parameters to inject.
        timeout: Wall-clock limit in seconds for the whole notebook (also the cell limit).
        progress: Show papermill's progress bar on stderr.
        cwd: Working directory of the kernel (default: the notebook's folder).

    Returns:
        The :class:`NotebookResult`; failures are reported, not raised.
    """
    path = Path(path)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    parameters = dict(parameters or {})
    cmd = [
        sys.executable, "-m", "papermill", str(path), str(output),
        "-k", "python3",
        "--cwd", str(Path(cwd) if cwd else path.parent),
        "-y", yaml.safe_dump(parameters, default_flow_style=True),
        "--progress-bar" if progress else "--no-progress-bar",
        "--log-level", "WARNING",
    ]  # fmt: skip
    if timeout is not None:
        cmd += ["--execution-timeout", str(int(max(1, timeout)))]
    env = dict(os.environ)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        start_new_session=True,
        env=env,
        text=True,
    )
    status = STATUS_OK
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        status = STATUS_TIMEOUT
    seconds = time.perf_counter() - start
    error, cell = "", None
    if status == STATUS_TIMEOUT:
        error = f"timed out after {timeout:g} s"
    elif proc.returncode != 0:
        status = STATUS_FAILED
        error, cell = _failure(output)
        if not error:
            tail = (stderr or stdout or "").strip().splitlines()
            error = tail[-1] if tail else f"papermill exited with status {proc.returncode}"
    records: dict[str, float] = {}
    details: dict[str, dict[str, Any]] = {}
    claims: list[dict[str, Any]] = []
    if output.exists():
        try:
            recs = read_record_details(output)
            records = {rec.key: rec.value for rec in recs}
            details = {rec.key: rec.detail() for rec in recs}
            claims = read_claims(output)
        except (HpcnbError, ValueError) as exc:
            if status == STATUS_OK:
                status, error = STATUS_FAILED, str(exc)
    return NotebookResult(
        notebook=path.stem,
        status=status,
        seconds=seconds,
        output=str(output),
        parameters=parameters,
        records=records,
        details=details,
        claims=claims,
        error=error,
        cell=cell,
    )


RUN_FILES = ("records.json", "records_detail.json", "claims.json", "run.json")


def write_run(out: str | Path, results: Iterable[NotebookResult]) -> None:
    """Write the JSON files of a run folder, merging with what is there.

    Writes ``records.json``, ``records_detail.json``, ``claims.json`` and ``run.json``
    (strict JSON: non-finite numbers are refused).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in RUN_FILES}
    tables = {
        name: json.loads(path.read_text()) if path.exists() else {} for name, path in paths.items()
    }
    for result in results:
        tables["records.json"][result.notebook] = result.records
        tables["records_detail.json"][result.notebook] = result.details
        tables["claims.json"][result.notebook] = result.claims
        info = asdict(result)
        for name in ("records", "details", "claims"):
            info.pop(name)
        tables["run.json"][result.notebook] = info
    for name, path in paths.items():
        text = json.dumps(tables[name], indent=2, sort_keys=True, allow_nan=False)
        path.write_text(text + "\n")


def run_notebooks(
    notebooks: Sequence[str | Path] = (),
    overrides: dict[str, Any] | None = None,
    *,
    smoke: bool = False,
    out: str | Path | None = None,
    timeout: float | None = None,
    progress: bool = True,
) -> list[NotebookResult]:
    """Validate, then execute notebooks one after another into a run folder.

    Args:
        notebooks: Paths or stems; empty means every notebook in ``notebooks/``.
        overrides: Parameter values for every notebook.
        smoke: Run with ``SMOKE=True``.
        out: Run folder (default ``papermill_runs/<UTC timestamp>``).
        timeout: Per-notebook wall-clock limit in seconds.
        progress: Show a progress bar per notebook.

    Returns:
        One result per notebook, in order; ``records.json`` and ``run.json`` are
        written after each notebook so partial runs keep what finished.

    Raises:
        ParameterError: Before anything runs, when a parameter is unknown or ill-typed.
    """
    plan = prepare(notebooks, overrides or {}, smoke=smoke)
    out_dir = Path(out) if out is not None else timestamped_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for path, params in plan:
        result = execute_notebook(
            path, out_dir / path.name, params, timeout=timeout, progress=progress
        )
        results.append(result)
        write_run(out_dir, [result])
    return results
