"""Markdown reports of run folders written by :mod:`hpcnb.runner`."""

from __future__ import annotations

import json
from pathlib import Path

from hpcnb.records import read_record_details, target_met

__all__ = ["render_report"]


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_report(run_dir: str | Path) -> str:
    """Return a markdown summary of a run folder.

    Lists each notebook's status and duration, then its records with unit, target,
    whether the target is met, and the paper's value side by side.

    Args:
        run_dir: A folder written by ``hpcnb run`` (holding ``run.json``).

    Raises:
        FileNotFoundError: The folder has no ``run.json``.
    """
    run_dir = Path(run_dir)
    run_path = run_dir / "run.json"
    if not run_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no run.json (not a folder written by 'hpcnb run')")
    run = json.loads(run_path.read_text())
    lines = [f"# hpcnb run {run_dir.name}", "", "| notebook | status | seconds | error |"]
    lines.append("|---|---|---|---|")
    for stem, info in sorted(run.items()):
        error = info.get("error", "")
        if info.get("cell") is not None:
            error = f"cell {info['cell']}: {error}"
        lines.append(
            f"| {stem} | {info['status']} | {info['seconds']:.1f} | {error.replace('|', '/')} |"
        )
    met_count = total_targets = 0
    for stem, info in sorted(run.items()):
        output = Path(info["output"])
        if not output.is_absolute() and not output.exists():
            output = run_dir / output.name
        if not output.exists():
            continue
        try:
            details = read_record_details(output)
        except ValueError as exc:
            lines += ["", f"## {stem}", "", f"records unreadable: {exc}"]
            continue
        if not details:
            continue
        lines += ["", f"## {stem}", "", "| key | value | unit | target | met | paper |"]
        lines.append("|---|---|---|---|---|---|")
        for rec in details:
            met = target_met(rec.value, rec.target)
            if met is not None:
                total_targets += 1
                met_count += int(met)
            mark = "" if met is None else ("yes" if met else "**no**")
            lines.append(
                f"| {rec.key} | {_fmt(rec.value)} | {rec.unit} | {_fmt(rec.target)} | {mark} "
                f"| {_fmt(rec.paper)} |"
            )
    ok = sum(info["status"] == "ok" for info in run.values())
    lines += ["", f"{ok}/{len(run)} notebooks completed; {met_count}/{total_targets} targets met."]
    return "\n".join(lines) + "\n"
