"""Which notebooks are stale, and why: ``hpcnb status``.

A notebook is *fresh* when its newest successful run in the run folders under
``papermill_runs/`` was made from the same inputs as a run now would be: the same code
cells, parameters, installed package, lock file, machine, measurement environment
(:func:`hpcnb.runfolder.measurement_environment`) and real-data files. Otherwise it is
*stale*, and the status names every input that changed (for the environment, the
variables or thread-pool libraries that differ); a notebook with no successful run is
*never run*. Runs recorded before ``run.json`` kept the parts of the fingerprint can only
be compared as a whole ("inputs changed (this run predates per-part records)").
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcnb.runfolder import (
    RunFolderError,
    data_states_match,
    inputs_parts,
    key_of,
    measurement_environment,
    read_run_tables,
)

__all__ = ["NotebookStatus", "notebook_status", "render_status"]

FRESH, STALE, NEVER = "fresh", "stale", "never run"


@dataclass(frozen=True)
class NotebookStatus:
    """The state of one notebook against its newest successful run.

    Attributes:
        notebook: The notebook stem.
        state: ``"fresh"``, ``"stale"`` or ``"never run"``.
        run: The run folder compared against (empty when never run).
        reasons: What changed, one short text per input.
    """

    notebook: str
    state: str
    run: str = ""
    reasons: tuple[str, ...] = ()


def _newest_ok(search_root: Path, stem: str) -> tuple[str, dict[str, Any]] | None:
    best: tuple[float, str, dict[str, Any]] | None = None
    if not search_root.is_dir():
        return None
    for run_json in search_root.glob("*/run.json"):
        try:
            info = read_run_tables(run_json.parent)["run.json"].get(stem)
            mtime = run_json.stat().st_mtime
        except (RunFolderError, OSError):
            continue
        usable = isinstance(info, dict) and info.get("status") == "ok" and info.get("inputs_key")
        if usable and isinstance(info, dict) and (best is None or mtime > best[0]):
            best = (mtime, run_json.parent.name, info)
    return None if best is None else (best[1], best[2])


def _environment_changes(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    out = []
    for name in sorted(set(then) | set(now)):
        if name == "threadpools":
            continue
        if then.get(name) != now.get(name):
            out.append(f"{name} {then.get(name) or 'unset'} -> {now.get(name) or 'unset'}")
    out += _pool_changes(then.get("threadpools") or [], now.get("threadpools") or [])
    return out


def _pool_changes(then: Sequence[Any], now: Sequence[Any]) -> list[str]:
    def by_api(pools: Sequence[Any]) -> dict[str, dict[str, Any]]:
        return {str(p.get("internal_api")): p for p in pools if isinstance(p, dict)}

    old, new = by_api(then), by_api(now)
    out = []
    for api in sorted(set(old) | set(new)):
        if api not in old or api not in new:
            out.append(f"{api} {'no longer loaded' if api in old else 'now loaded'}")
            continue
        for field in ("version", "architecture", "num_threads", "threading_layer"):
            a, b = old[api].get(field), new[api].get(field)
            if a != b:
                out.append(f"{api} {field.replace('num_', '')} {a} -> {b}")
    return out


def notebook_status(
    notebook: Path,
    parameters: Mapping[str, Any],
    search_root: str | Path,
    environment: Mapping[str, Any] | None = None,
) -> NotebookStatus:
    """Compare a notebook's inputs now with those of its newest successful run.

    Args:
        notebook: The notebook file.
        parameters: The effective parameters a run now would use.
        search_root: The folder of run folders (``papermill_runs``).
        environment: The measurement environment now (default: this process's).
    """
    stem = notebook.stem
    found = _newest_ok(Path(search_root), stem)
    if found is None:
        return NotebookStatus(stem, NEVER)
    run, info = found
    if info.get("cached_from"):
        run = f"{run} (cached from {info['cached_from']})"
    parts = inputs_parts(notebook, parameters, environment or measurement_environment())
    reasons: list[str] = []
    then_parts = dict(info.get("inputs") or {})
    if then_parts:
        for name in ("code", "parameters", "package", "lock", "machine"):
            if then_parts.get(name) != parts[name]:
                label = {"lock": "lock file", "package": "hpcnb package", "code": "code cells"}
                reasons.append(f"{label.get(name, name)} changed")
        reasons += _environment_changes(info.get("environment") or {}, parts["environment"])
    elif info.get("inputs_key") != key_of(parts):
        reasons.append("inputs changed (this run predates per-part records)")
    with contextlib.suppress(Exception):
        if not data_states_match(info.get("data") or {}):
            reasons.append("real-data files changed")
    return NotebookStatus(stem, STALE if reasons else FRESH, run, tuple(reasons))


def render_status(statuses: Sequence[NotebookStatus]) -> str:
    """Return the statuses as a markdown table."""
    lines = ["| notebook | state | newest successful run | what changed |", "|---|---|---|---|"]
    for st in statuses:
        why = "; ".join(st.reasons).replace("|", "\\|")
        lines.append(f"| {st.notebook} | {st.state} | {st.run} | {why} |")
    return "\n".join(lines) + "\n"
