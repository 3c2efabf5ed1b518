"""Markdown reports of run folders written by :mod:`hpcnb.runner`.

The report opens with a notice when the run used smoke inputs (``SMOKE=True``) and lists
each notebook's status and the parameters it ran with, then per notebook its records
(value, interval, n, unit, target and whose it is, whether the target is met, source,
paper), its claims with
their verdicts and readings, and the run-to-run spread: records whose values moved between
this run and earlier runs of the same notebook (same parameters, same machine) in sibling
run folders, and claims whose verdict changed. It closes with claim counts by verdict and
the number of paper claims judged on our targets instead of the paper's figure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.claims import (
    NOT_TESTED_SMOKE,
    SUCCESS,
    VERDICTS,
    paper_claims_judged_on_own_targets,
    read_claims,
)
from hpcnb.errors import HpcnbError, MissingFileError
from hpcnb.history import earlier_runs, moved, record_history, verdict_flips
from hpcnb.records import MET, NOT_TESTED, Record, read_record_details
from hpcnb.runfolder import RunFolderError, read_run_tables

__all__ = ["environment_text", "parameters_text", "render_report"]


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return " ".join(str(value).replace("|", "\\|").split())


def parameters_text(parameters: dict[str, Any] | None) -> str:
    """The parameters a notebook ran with: ``SEED=1, SMOKE=True``; the rest at its defaults.

    Args:
        parameters: The injected parameters as stored in ``run.json`` (``None`` or empty:
            every parameter at the notebook's default).
    """
    if not parameters:
        return "notebook defaults"
    return ", ".join(f"`{name}={value!r}`" for name, value in sorted(parameters.items()))


def _is_smoke(info: dict[str, Any]) -> bool:
    return (info.get("parameters") or {}).get("SMOKE") is True


def _smoke_notice(run: dict[str, Any]) -> list[str]:
    """The notice at the top of a report of a run on smoke inputs (empty otherwise)."""
    smoke = sorted(stem for stem, info in run.items() if _is_smoke(info))
    if not smoke:
        return []
    which = "every notebook" if len(smoke) == len(run) else ", ".join(smoke)
    return [
        f"**SMOKE run** ({which}: `SMOKE=True`): miniature inputs that check the notebooks "
        f"run, not the papers' results; paper claims read *{NOT_TESTED_SMOKE}*.",
        "",
    ]


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{counter[v]} {v}" for v in VERDICTS if counter[v]) or "none"


def _output_path(run_dir: Path, info: dict[str, Any]) -> Path:
    output = Path(info["output"])
    if not output.is_absolute() and not output.exists():
        output = run_dir / output.name
    if not output.exists():
        output = run_dir / output.name
    return output


def _spread(
    run_dir: Path,
    stem: str,
    info: dict[str, Any],
    details: list[Record],
    claims: list[dict[str, Any]],
) -> list[str]:
    """The run-to-run section of one notebook (empty when nothing moved)."""
    try:
        before = (run_dir / "run.json").stat().st_mtime
    except OSError:
        return []
    runs = earlier_runs(
        run_dir.parent,
        stem,
        machine=str(info.get("machine", "")),
        parameters=info.get("parameters") or {},
        exclude=run_dir,
        before=before,
    )
    if not runs:
        return []
    history = record_history(runs)
    lines = []
    for rec in details:
        earlier = history.get(rec.key, [])
        if not earlier or not moved(rec.value, earlier):
            continue
        then = "; ".join(
            f"{e['run']}: {_fmt(e['value'])}"
            + (f" [{_fmt(e['low'])}, {_fmt(e['high'])}]" if e.get("low") is not None else "")
            + (f" {e['met']}" if e.get("met") else "")
            for e in earlier
        )
        now = _fmt(rec.value) + (
            f" [{_fmt(rec.low)}, {_fmt(rec.high)}]" if rec.low is not None else ""
        )
        lines.append(f"| {rec.key} | {now} {rec.met or ''} | {then} |")
    flips = verdict_flips(claims, runs)
    out = []
    if lines:
        out += [
            "",
            f"Run-to-run spread over {len(runs)} earlier run(s) of {stem} on this machine:",
            "",
            "| record | this run | earlier runs |",
            "|---|---|---|",
            *lines,
        ]
    for text, verdict, earlier_verdicts in flips:
        was = ", ".join(f"{v} ({r})" for r, v in earlier_verdicts)
        out.append(f"\nVerdict changed: *{_fmt(text)}* is {verdict} here, was {was}.")
    return out


def environment_text(environment: dict[str, Any]) -> str:
    """One line of a measurement environment: the variables set, then the thread pools."""
    pools = environment.get("threadpools") or []
    names = sorted(k for k, v in environment.items() if k != "threadpools" and v is not None)
    parts = [f"`{k}={environment[k]}`" for k in names] or ["no thread or BLAS variable set"]
    for pool in pools:
        if isinstance(pool, dict):
            fields = [pool.get(k) for k in ("internal_api", "version", "architecture")]
            text = " ".join(str(f) for f in fields if f)
            if pool.get("num_threads"):
                text += f", {pool['num_threads']} threads"
            parts.append(text or str(pool))
    return "; ".join(parts)


def _environments(run: dict[str, Any]) -> list[str]:
    groups: dict[str, list[str]] = {}
    for stem, info in sorted(run.items()):
        env = info.get("environment")
        if isinstance(env, dict) and env:
            groups.setdefault(environment_text(env), []).append(stem)
    if not groups:
        return []
    lines = ["", "Measurement environment (part of the inputs fingerprint):", ""]
    for text, stems in groups.items():
        lines.append(f"- {', '.join(stems)}: {text}")
    return lines


@dataclass
class _Tally:
    """Counts gathered over the notebooks of a run for the report's summary lines."""

    met: int = 0
    targets: int = 0
    overall: Counter[str] = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)
    per_notebook: dict[str, Counter[str]] = field(default_factory=dict)


def _records_table(details: list[Record], tally: _Tally) -> list[str]:
    """The markdown table of a notebook's records (tested targets counted in ``tally``)."""
    if not details:
        return []
    lines = [
        "| key | value | interval | n | unit | target | whose | met | source | paper |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in details:
        met = rec.met
        if met is not None and met != NOT_TESTED:
            tally.targets += 1
            tally.met += int(met == MET)
        interval = "" if rec.low is None else f"[{_fmt(rec.low)}, {_fmt(rec.high)}]"
        if rec.interval_note:
            interval = f"{interval} {rec.interval_note}".strip()
        mark = "" if met is None else (met if met == MET else f"**{met}**")
        whose = "" if rec.target is None else rec.target_from
        target = _fmt(rec.target)
        if rec.own_target is not None:
            target += f" (ours: {_fmt(rec.own_target)}, {rec.own_met})"
        lines.append(
            f"| {_fmt(rec.key)} | {_fmt(rec.value)} | {_fmt(interval)} | {_fmt(rec.n)} "
            f"| {_fmt(rec.unit)} | {_fmt(target)} | {_fmt(whose)} | {mark} "
            f"| {_fmt(rec.source)} | {_fmt(rec.paper)} |"
        )
    return lines


def _claims_lines(claims: list[dict[str, Any]], counter: Counter[str]) -> list[str]:
    """The markdown table of a notebook's claims and its verdict counts (into ``counter``)."""
    if not claims:
        return []
    lines = [
        "",
        "| claim | kind | paper | measured | verdict | reading |",
        "|---|---|---|---|---|---|",
    ]
    for row in claims:
        counter[row["verdict"]] += 1
        reading = "" if row["verdict"] in SUCCESS else row.get("explanation")
        lines.append(
            f"| {_fmt(row['claim'])} | {_fmt(row.get('kind'))} | {_fmt(row.get('paper'))} "
            f"| {_fmt(row.get('measured'))} | {_fmt(row['verdict'])} | {_fmt(reading)} |"
        )
    return [*lines, "", f"Claims: {_counts(counter)}."]


def _notebook_section(run_dir: Path, stem: str, info: dict[str, Any], tally: _Tally) -> list[str]:
    """The report's section of one notebook: parameters, records, claims and spread."""
    output = _output_path(run_dir, info)
    counter: Counter[str] = Counter()
    tally.per_notebook[stem] = counter
    if not output.exists():
        return []
    try:
        details = read_record_details(output)
        claims = read_claims(output)
    except (HpcnbError, ValueError) as exc:
        return ["", f"## {_fmt(stem)}", "", f"records unreadable: {_fmt(exc)}"]
    if not details and not claims:
        return []
    lines = ["", f"## {_fmt(stem)}", "", f"Parameters: {parameters_text(info.get('parameters'))}."]
    lines += ["", *_records_table(details, tally), *_claims_lines(claims, counter)]
    tally.rows += claims
    lines += _spread(run_dir, stem, info, details, claims)
    tally.overall.update(counter)
    return lines


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
        raise MissingFileError(f"{run_dir}: no run.json (not a folder written by 'hpcnb run')")
    run = read_run_tables(run_dir)["run.json"]  # every entry validated
    for stem, info in run.items():
        if not {"status", "seconds", "output"} <= set(info):
            raise RunFolderError(f"{run_path}: entry {stem!r} is not a notebook result")
    lines = [f"# hpcnb run {run_dir.name}", "", *_smoke_notice(run)]
    lines += [
        "| notebook | status | seconds | claims | error | parameters |",
        "|---|---|---|---|---|---|",
    ]
    tally = _Tally()
    sections: list[str] = []
    for stem, info in sorted(run.items()):
        sections += _notebook_section(run_dir, stem, info, tally)
    for stem, info in sorted(run.items()):
        error = info.get("error", "")
        if info.get("cell") is not None:
            error = f"cell {info['cell']}: {error}"
        lines.append(
            f"| {_fmt(stem)} | {info['status']} | {info['seconds']:.1f} "
            f"| {_counts(tally.per_notebook[stem])} | {_fmt(error)} "
            f"| {_fmt(parameters_text(info.get('parameters')))} |"
        )
    lines += _environments(run)
    lines += sections
    ok = sum(info["status"] == "ok" for info in run.values())
    judged_on_ours = paper_claims_judged_on_own_targets(tally.rows)
    lines += [
        "",
        f"{ok}/{len(run)} notebooks completed; {tally.met}/{tally.targets} tested targets met "
        "(synthetic records are not tested).",
        f"Claims overall ({sum(tally.overall.values())}): {_counts(tally.overall)}.",
        "Paper claims that give the paper's figure but were judged on other targets "
        f"(claims.paper_claims_judged_on_own_targets): {judged_on_ours}.",
    ]
    return "\n".join(lines) + "\n"
