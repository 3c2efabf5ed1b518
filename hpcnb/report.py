"""Markdown reports of run folders written by :mod:`hpcnb.runner`.

The report lists each notebook's status, then per notebook its records (value, 95 %
interval, n, unit, target, whether the target is met, source, paper) and its claims
with their verdicts, and counts claims by verdict per notebook and overall.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from hpcnb.claims import VERDICTS, read_claims
from hpcnb.errors import HpcnbError
from hpcnb.records import MET, NOT_TESTED, read_record_details
from hpcnb.runfolder import RunFolderError, read_run_tables

__all__ = ["render_report"]


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{counter[v]} {v}" for v in VERDICTS if counter[v]) or "none"


def _output_path(run_dir: Path, info: dict[str, Any]) -> Path:
    output = Path(info["output"])
    if not output.is_absolute() and not output.exists():
        output = run_dir / output.name
    if not output.exists():
        output = run_dir / output.name
    return output


def render_report(run_dir: str | Path) -> str:
    """Return a markdown summary of a run folder.

    Lists each notebook's status and duration, then its records with interval, unit,
    target, target state (met / not met / inconclusive / not tested), source and the
    paper's value, then its claims with verdicts; closes with claim counts by verdict.

    Args:
        run_dir: A folder written by ``hpcnb run`` (holding ``run.json``).

    Raises:
        FileNotFoundError: The folder has no ``run.json``.
        RunFolderError: ``run.json`` is corrupt or not shaped like a run.
    """
    run_dir = Path(run_dir)
    run_path = run_dir / "run.json"
    if not run_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no run.json (not a folder written by 'hpcnb run')")
    run = read_run_tables(run_dir)["run.json"]
    for stem, info in run.items():
        if not isinstance(info, dict) or not {"status", "seconds", "output"} <= set(info):
            raise RunFolderError(f"{run_path}: entry {stem!r} is not a notebook result")
    lines = [f"# hpcnb run {run_dir.name}", "", "| notebook | status | seconds | claims | error |"]
    lines.append("|---|---|---|---|---|")
    sections: list[str] = []
    met_count = total_targets = 0
    overall: Counter[str] = Counter()
    per_notebook: dict[str, Counter[str]] = {}
    for stem, info in sorted(run.items()):
        output = _output_path(run_dir, info)
        counter: Counter[str] = Counter()
        per_notebook[stem] = counter
        if not output.exists():
            continue
        try:
            details = read_record_details(output)
            claims = read_claims(output)
        except (HpcnbError, ValueError) as exc:
            sections += ["", f"## {stem}", "", f"records unreadable: {exc}"]
            continue
        if not details and not claims:
            continue
        sections += ["", f"## {stem}", ""]
        if details:
            sections += [
                "| key | value | 95 % interval | n | unit | target | met | source | paper |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        for rec in details:
            met = rec.met
            if met is not None and met != NOT_TESTED:
                total_targets += 1
                met_count += int(met == MET)
            interval = "" if rec.low is None else f"[{_fmt(rec.low)}, {_fmt(rec.high)}]"
            mark = "" if met is None else (met if met == MET else f"**{met}**")
            sections.append(
                f"| {rec.key} | {_fmt(rec.value)} | {interval} | {_fmt(rec.n)} | {rec.unit} "
                f"| {_fmt(rec.target)} | {mark} | {rec.source} | {_fmt(rec.paper)} |"
            )
        if claims:
            sections += ["", "| claim | kind | paper | measured | verdict |"]
            sections.append("|---|---|---|---|---|")
            for row in claims:
                counter[row["verdict"]] += 1
                sections.append(
                    f"| {_fmt(row['claim'])} | {_fmt(row.get('kind'))} | {_fmt(row.get('paper'))} "
                    f"| {_fmt(row.get('measured'))} | {_fmt(row['verdict'])} |"
                )
            sections += ["", f"Claims: {_counts(counter)}."]
        overall.update(counter)
    for stem, info in sorted(run.items()):
        error = info.get("error", "")
        if info.get("cell") is not None:
            error = f"cell {info['cell']}: {error}"
        lines.append(
            f"| {stem} | {info['status']} | {info['seconds']:.1f} | {_counts(per_notebook[stem])} "
            f"| {_fmt(error)} |"
        )
    lines += sections
    ok = sum(info["status"] == "ok" for info in run.values())
    lines += [
        "",
        f"{ok}/{len(run)} notebooks completed; {met_count}/{total_targets} tested targets met "
        "(synthetic records are not tested).",
        f"Claims overall ({sum(overall.values())}): {_counts(overall)}.",
    ]
    return "\n".join(lines) + "\n"
