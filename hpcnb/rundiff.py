"""What changed between two run folders: ``hpcnb diff RUN_A RUN_B``.

Three lists, as markdown: notebooks present in one run only (or that failed in one), records
that *moved beyond their intervals* (each run's value lies outside the other run's
interval; for a record without an interval, any change beyond rounding), and claims whose
verdict changed. Records that moved within their intervals are counted, not listed: that
is the noise the intervals already describe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.errors import MissingFileError
from hpcnb.runfolder import RunFolderError, read_run_tables

__all__ = ["RunDiff", "diff_runs", "moved_beyond", "render_diff"]


@dataclass
class RunDiff:
    """The differences between run ``a`` and run ``b``.

    Attributes:
        a: Name of the first run folder.
        b: Name of the second.
        only_a: Notebooks with a result in ``a`` only.
        only_b: Notebooks with a result in ``b`` only.
        status: ``(notebook, status in a, status in b)`` where they differ.
        moved: ``(notebook, key, detail in a, detail in b)`` beyond the intervals.
        within: How many records changed within their intervals.
        verdicts: ``(notebook, claim, verdict in a, verdict in b)``.
    """

    a: str
    b: str
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    status: list[tuple[str, str, str]] = field(default_factory=list)
    moved: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    within: int = 0
    verdicts: list[tuple[str, str, str, str]] = field(default_factory=list)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _inside(value: float, detail: Mapping[str, Any]) -> bool:
    low, high = _num(detail.get("low")), _num(detail.get("high"))
    return low is not None and high is not None and low <= value <= high


def moved_beyond(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool | None:
    """Whether a record moved beyond its intervals between two runs.

    Args:
        a: The record's entry in the first run (``value``, ``low``, ``high``).
        b: Its entry in the second run.

    Returns:
        ``True`` when each value lies outside the other run's interval (or, without
        intervals, the values differ beyond rounding), ``False`` when it moved within
        them, ``None`` when it did not change.
    """
    va, vb = _num(a.get("value")), _num(b.get("value"))
    if va is None or vb is None or math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12):
        return None
    has_a = _num(a.get("low")) is not None and _num(a.get("high")) is not None
    has_b = _num(b.get("low")) is not None and _num(b.get("high")) is not None
    if not has_a and not has_b:
        return True
    return not ((has_a and _inside(vb, a)) or (has_b and _inside(va, b)))


def diff_runs(run_a: str | Path, run_b: str | Path) -> RunDiff:
    """Compare two run folders written by ``hpcnb run``.

    Args:
        run_a: The earlier run folder.
        run_b: The later run folder.

    Raises:
        FileNotFoundError: A folder has no ``run.json``.
        RunFolderError: A run file is corrupt.
    """
    tables = []
    for run in (Path(run_a), Path(run_b)):
        if not (run / "run.json").is_file():
            raise MissingFileError(f"{run}: no run.json (not a folder written by 'hpcnb run')")
        tables.append(read_run_tables(run))
    ta, tb = tables
    out = RunDiff(Path(run_a).name, Path(run_b).name)
    runs_a, runs_b = ta["run.json"], tb["run.json"]
    out.only_a = sorted(set(runs_a) - set(runs_b))
    out.only_b = sorted(set(runs_b) - set(runs_a))
    for stem in sorted(set(runs_a) & set(runs_b)):
        sa, sb = (
            r.get(stem, {}).get("status") if isinstance(r.get(stem), dict) else None
            for r in (runs_a, runs_b)
        )
        if sa != sb:
            out.status.append((stem, str(sa), str(sb)))
        da = ta["records_detail.json"].get(stem) or {}
        db = tb["records_detail.json"].get(stem) or {}
        if not isinstance(da, dict) or not isinstance(db, dict):
            raise RunFolderError(f"records_detail.json: entry {stem!r} is not a mapping")
        for key in sorted(set(da) & set(db)):
            if not isinstance(da[key], dict) or not isinstance(db[key], dict):
                continue
            state = moved_beyond(da[key], db[key])
            if state:
                out.moved.append((stem, key, da[key], db[key]))
            elif state is False:
                out.within += 1
        ca = {r.get("claim"): r for r in ta["claims.json"].get(stem) or [] if isinstance(r, dict)}
        cb = {r.get("claim"): r for r in tb["claims.json"].get(stem) or [] if isinstance(r, dict)}
        for text in [t for t in ca if t in cb]:
            if ca[text].get("verdict") != cb[text].get("verdict"):
                out.verdicts.append(
                    (stem, str(text), str(ca[text].get("verdict")), str(cb[text].get("verdict")))
                )
    return out


def _fmt(detail: Mapping[str, Any]) -> str:
    text = f"{detail.get('value'):.4g}" if _num(detail.get("value")) is not None else "?"
    if _num(detail.get("low")) is not None and _num(detail.get("high")) is not None:
        text += f" [{detail['low']:.4g}, {detail['high']:.4g}]"
    if detail.get("met"):
        text += f" {detail['met']}"
    return text


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_diff(diff: RunDiff) -> str:
    """Return the differences as markdown."""
    lines = [f"# hpcnb diff {diff.a} → {diff.b}", ""]
    if diff.only_a or diff.only_b:
        lines += [
            f"- only in {diff.a}: {', '.join(diff.only_a) or 'none'}",
            f"- only in {diff.b}: {', '.join(diff.only_b) or 'none'}",
            "",
        ]
    for stem, sa, sb in diff.status:
        lines.append(f"- {stem}: {sa} → {sb}")
    if diff.status:
        lines.append("")
    lines.append(f"## Records that moved beyond their intervals ({len(diff.moved)})")
    lines.append("")
    if diff.moved:
        lines += [f"| notebook | record | {diff.a} | {diff.b} |", "|---|---|---|---|"]
        lines += [f"| {s} | {k} | {_fmt(a)} | {_fmt(b)} |" for s, k, a, b in diff.moved]
        lines.append("")
    lines.append(f"{diff.within} other record(s) changed within their intervals.")
    lines += ["", f"## Claims whose verdict changed ({len(diff.verdicts)})", ""]
    if diff.verdicts:
        lines += [f"| notebook | claim | {diff.a} | {diff.b} |", "|---|---|---|---|"]
        lines += [f"| {s} | {_cell(c)} | {va} | {vb} |" for s, c, va, vb in diff.verdicts]
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"
