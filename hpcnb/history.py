"""Run-to-run history: a record's values in earlier runs of the same notebook.

Timing verdicts can flip between runs minutes apart, and a reader of one run sees only
one value. This module finds the earlier runs of a notebook in the sibling folders of a
run folder (``papermill_runs/*``) and gives each record's earlier values, so the claims
table and ``report.md`` can show the spread.

An earlier run counts when it is a successful run of the same notebook, executed (not
re-used from another folder), with the same parameters and on the same machine
(:func:`hpcnb.paths.machine_key`, kept in ``run.json``). The newest
:data:`HISTORY_LIMIT` runs are kept, oldest first.

The runner writes the history of the notebook it is about to execute to a JSON file and
names it in the kernel's environment (:data:`HISTORY_ENV`); :func:`session_history` reads
it back inside the notebook. Outside the runner there is no history and nothing changes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcnb.records import Record

__all__ = [
    "HISTORY_ENV",
    "HISTORY_LIMIT",
    "EarlierRun",
    "earlier_runs",
    "history_text",
    "moved",
    "record_history",
    "session_history",
    "verdict_flips",
    "write_history",
]

HISTORY_ENV = "HPCNB_HISTORY"
HISTORY_LIMIT = 5
MAX_HISTORY_BYTES = 8_000_000  # a history file larger than this is ignored


@dataclass(frozen=True)
class EarlierRun:
    """One earlier run of a notebook.

    Attributes:
        run: The run folder's name.
        details: ``{key: {value, low, high, met, ...}}`` from its ``records_detail.json``.
        claims: Its claims rows from ``claims.json``.
    """

    run: str
    details: dict[str, dict[str, Any]]
    claims: list[dict[str, Any]]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def earlier_runs(
    search_root: str | Path,
    stem: str,
    *,
    machine: str,
    parameters: Mapping[str, Any],
    exclude: str | Path | None = None,
    before: float | None = None,
    limit: int = HISTORY_LIMIT,
) -> list[EarlierRun]:
    """Find the earlier comparable runs of ``stem`` in the run folders under ``search_root``.

    Unreadable or foreign folders are skipped, never an error.

    Args:
        search_root: The folder holding run folders (``papermill_runs``).
        stem: The notebook stem.
        machine: The machine key the runs must share.
        parameters: The effective parameters the runs must share.
        exclude: A run folder to leave out (the current one).
        before: Only runs whose ``run.json`` is older than this time stamp (seconds).
        limit: Keep at most this many, the newest.

    Returns:
        The runs, oldest first.
    """
    root = Path(search_root)
    if not root.is_dir():
        return []
    skip = Path(exclude).resolve() if exclude is not None else None
    wanted = json.dumps(dict(parameters), sort_keys=True, default=str)
    found: list[tuple[float, EarlierRun]] = []
    for run_json in root.glob("*/run.json"):
        folder = run_json.parent
        if skip is not None and folder.resolve() == skip:
            continue
        try:
            mtime = run_json.stat().st_mtime
        except OSError:
            continue
        if before is not None and mtime >= before:
            continue
        info = _read(run_json).get(stem)
        if not isinstance(info, dict) or info.get("status") != "ok" or info.get("cached_from"):
            continue
        if info.get("machine") != machine:
            continue
        if json.dumps(info.get("parameters") or {}, sort_keys=True, default=str) != wanted:
            continue
        details = _read(folder / "records_detail.json").get(stem)
        claims = _read(folder / "claims.json").get(stem)
        if not isinstance(details, dict):
            continue
        found.append(
            (mtime, EarlierRun(folder.name, details, claims if isinstance(claims, list) else []))
        )
    found.sort(key=lambda item: item[0])
    return [run for _, run in found[-limit:]] if limit > 0 else []


def record_history(runs: Sequence[EarlierRun]) -> dict[str, list[dict[str, Any]]]:
    """Return ``{key: [{run, value, low, high, met}, ...]}`` over ``runs`` (oldest first)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for key, detail in run.details.items():
            if not isinstance(detail, dict) or not isinstance(detail.get("value"), int | float):
                continue
            out.setdefault(key, []).append(
                {"run": run.run, **{k: detail.get(k) for k in ("value", "low", "high", "met")}}
            )
    return out


def write_history(path: str | Path, runs: Sequence[EarlierRun]) -> Path:
    """Write the record history of ``runs`` as JSON to ``path`` (for :data:`HISTORY_ENV`).

    Args:
        path: The JSON file to write.
        runs: Earlier runs of the notebook (from :func:`earlier_runs`).
    """
    path = Path(path)
    path.write_text(json.dumps(record_history(runs), allow_nan=False), encoding="utf-8")
    return path


def session_history() -> dict[str, list[dict[str, Any]]]:
    """Return the record history the runner passed to this kernel (``{}`` when none)."""
    name = os.environ.get(HISTORY_ENV)
    if not name:
        return {}
    path = Path(name)
    with contextlib.suppress(OSError):
        if path.stat().st_size > MAX_HISTORY_BYTES:
            return {}
    data = _read(path)
    return {k: v for k, v in data.items() if isinstance(v, list)}


def moved(value: float, earlier: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any earlier value differs from ``value`` (beyond rounding).

    Args:
        value: This run's value of a record.
        earlier: The record's entries in earlier runs (``value``, ``low``, ``high``, ``met``).
    """
    return any(
        not math.isclose(float(e["value"]), value, rel_tol=1e-9, abs_tol=1e-12)
        for e in earlier
        if isinstance(e.get("value"), int | float)
    )


def _fmt(entry: Mapping[str, Any]) -> str:
    text = f"{float(entry['value']):.4g}"
    if isinstance(entry.get("low"), int | float) and isinstance(entry.get("high"), int | float):
        text += f" [{float(entry['low']):.4g}, {float(entry['high']):.4g}]"
    if entry.get("met"):
        text += f" {entry['met']}"
    return text


def history_text(rec: Record, earlier: Sequence[Mapping[str, Any]]) -> str:
    """Return ``"earlier runs: 0.143 [..] met, 0.097 [..] inconclusive"``, or ``""``.

    Only a record whose value moved between runs gets a text; the states are marked
    ``(flipped)`` when one differs from this run's.

    Args:
        rec: The record of this run.
        earlier: Its entries in earlier runs.
    """
    if not earlier or not moved(rec.value, earlier):
        return ""
    items = [_fmt(e) for e in earlier if isinstance(e.get("value"), int | float)]
    text = "earlier runs: " + ", ".join(items)
    states = {e.get("met") for e in earlier}
    if rec.target is not None and states - {rec.met}:
        text += " (verdict flipped)"
    return text


def verdict_flips(
    rows: Sequence[Mapping[str, Any]], runs: Sequence[EarlierRun]
) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Return ``(claim, verdict now, [(run, verdict then), ...])`` for claims that changed.

    Args:
        rows: This run's claims rows.
        runs: Earlier runs of the notebook, with their claims.
    """
    flips = []
    for row in rows:
        text = row.get("claim")
        then = [
            (run.run, str(old.get("verdict")))
            for run in runs
            for old in run.claims
            if isinstance(old, dict) and old.get("claim") == text
        ]
        if any(v != row.get("verdict") for _, v in then):
            flips.append((str(text), str(row.get("verdict")), then))
    return flips
