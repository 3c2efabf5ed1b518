"""Claims: verdicts computed in one place from the records a notebook emitted.

A notebook states each claim once, naming the records that test it::

    claim("pruning halves FLOPs with < 1 % accuracy loss",
          records=["pruning.flops_ratio", "pruning.accuracy_drop"], paper="-0.2 % at 50 %")
    claims_table()

:func:`claims_table` reads the records already emitted in this kernel
(:func:`hpcnb.records.session_records`) and decides each verdict from their targets,
intervals and sources only, so a record and its claims row can never disagree. The
verdict vocabulary is fixed (:data:`VERDICTS`):

* ``by construction`` — the claim's kind says the value is set by a parameter;
* ``not tested (synthetic data)`` — a record rests on a synthetic stand-in;
* ``simulated only`` — a record is a model's prediction (``source="simulated"``);
* ``own design`` — the claim is ours, not the paper's (its records still show met/not met);
* ``reproduced`` — every record with a target meets it (its whole interval does);
* ``not reproduced`` — some record misses its target (its whole interval does);
* ``inconclusive`` — otherwise: an interval straddles a bound.

The table is displayed and emitted as an ``application/vnd.hpcnb.claims+json`` output,
which ``hpcnb run`` collects into ``claims.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcnb.errors import ClaimError
from hpcnb.records import (
    INCONCLUSIVE,
    KEY_PATTERN,
    MET,
    NOT_MET,
    Record,
    emit,
    load_notebook,
    on_clear_session,
    session_records,
)

CLAIMS_MIME = "application/vnd.hpcnb.claims+json"
KINDS = ("paper", "own design", "by construction")
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_TESTED_SYNTHETIC = "not tested (synthetic data)"
SIMULATED_ONLY = "simulated only"
BY_CONSTRUCTION = "by construction"
OWN_DESIGN = "own design"
VERDICTS = (
    REPRODUCED,
    NOT_REPRODUCED,
    INCONCLUSIVE,
    NOT_TESTED_SYNTHETIC,
    SIMULATED_ONLY,
    BY_CONSTRUCTION,
    OWN_DESIGN,
)
_CLAIMS: dict[str, Claim] = {}

__all__ = [
    "CLAIMS_MIME",
    "KINDS",
    "VERDICTS",
    "Claim",
    "ClaimRow",
    "audit_claims",
    "claim",
    "claims_table",
    "clear_claims",
    "evaluate_claims",
    "measured_text",
    "read_claims",
    "session_claims",
    "verdict",
]


@dataclass(frozen=True)
class Claim:
    """A claim as the notebook states it.

    Attributes:
        text: The claim, in full.
        records: Keys of the records that test it.
        paper: The paper's figure (a number or short text), ``None`` for our own claims.
        kind: ``"paper"``, ``"own design"`` or ``"by construction"``.
    """

    text: str
    records: tuple[str, ...]
    paper: float | str | None = None
    kind: str = "paper"


@dataclass(frozen=True)
class ClaimRow:
    """One row of a claims table: a claim with what was measured and its verdict."""

    claim: str
    kind: str
    paper: float | str | None
    measured: str
    verdict: str
    records: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the row as an entry of ``claims.json``."""
        return {
            "claim": self.claim,
            "kind": self.kind,
            "paper": self.paper,
            "measured": self.measured,
            "verdict": self.verdict,
            "records": list(self.records),
        }


def claim(
    text: str,
    *,
    records: Sequence[str],
    paper: float | str | None = None,
    kind: str = "paper",
) -> None:
    """State a claim tested by ``records`` (keys recorded before :func:`claims_table`).

    Stating the same text again (re-running a cell) replaces the earlier claim.

    Args:
        text: The claim, in full.
        records: Record keys; at least one.
        paper: The paper's figure for this claim (``"2.15x at 8 nodes"``, ``0.35``).
        kind: ``"paper"`` (the paper's claim), ``"own design"`` (ours) or
            ``"by construction"`` (set by a parameter).

    Raises:
        ClaimError: Empty text, no records, a malformed key or an unknown kind.
    """
    if not isinstance(text, str) or not text.strip():
        raise ClaimError("claim text must be a non-empty string")
    if kind not in KINDS:
        raise ClaimError(f"claim {text!r}: kind {kind!r} is not one of {KINDS}")
    if isinstance(records, str):
        records = [records]
    keys = tuple(records)
    if not keys:
        raise ClaimError(f"claim {text!r}: name at least one record")
    for key in keys:
        if not isinstance(key, str) or not KEY_PATTERN.match(key):
            raise ClaimError(f"claim {text!r}: {key!r} is not a record key")
    if paper is not None and not isinstance(paper, str):
        paper = float(paper)
    _CLAIMS[text] = Claim(text=text, records=keys, paper=paper, kind=kind)


def session_claims() -> list[Claim]:
    """Return the claims stated in this process, in order."""
    return list(_CLAIMS.values())


def clear_claims() -> None:
    """Forget the claims stated in this process."""
    _CLAIMS.clear()


on_clear_session(clear_claims)


def verdict(kind: str, records: Sequence[Record]) -> str:
    """Return the verdict that ``records`` imply for a claim of ``kind``.

    Raises:
        ClaimError: A ``paper`` claim none of whose records has a target.
    """
    if kind == "by construction":
        return BY_CONSTRUCTION
    if any(rec.source == "synthetic" for rec in records):
        return NOT_TESTED_SYNTHETIC
    if any(rec.source == "simulated" for rec in records):
        return SIMULATED_ONLY
    if kind == "own design":
        return OWN_DESIGN
    states = [rec.met for rec in records if rec.target is not None]
    if not states:
        keys = ", ".join(rec.key for rec in records)
        raise ClaimError(f"a paper claim needs a record with a target; none of {keys} has one")
    if NOT_MET in states:
        return NOT_REPRODUCED
    if all(state == MET for state in states):
        return REPRODUCED
    return INCONCLUSIVE


def _num(value: float) -> str:
    return f"{value:.4g}"


def measured_text(records: Sequence[Record]) -> str:
    """Return what was measured, record by record, with intervals, targets and sources."""
    parts = []
    for rec in records:
        text = _num(rec.value) + (f" {rec.unit}" if rec.unit else "")
        if rec.low is not None and rec.high is not None:
            text += f" [{_num(rec.low)}, {_num(rec.high)}]"
        if rec.n is not None:
            text += f" (n={rec.n})"
        if rec.target is not None:
            text += f", target {rec.target}: {rec.met}"
        if rec.source != "real":
            text += f", {rec.source}"
        if len(records) > 1:
            text = f"{rec.key.split('.', 1)[1]} = {text}"
        parts.append(text)
    return "; ".join(parts)


def evaluate_claims(
    claims: Iterable[Claim] | None = None, records: Mapping[str, Record] | None = None
) -> list[ClaimRow]:
    """Compute the rows of the claims table.

    Args:
        claims: The claims (default: those stated in this process).
        records: Records by key (default: those emitted in this process).

    Raises:
        ClaimError: A claim names a record that was not emitted.
    """
    claims = session_claims() if claims is None else list(claims)
    records = session_records() if records is None else records
    rows = []
    for item in claims:
        missing = [key for key in item.records if key not in records]
        if missing:
            raise ClaimError(
                f"claim {item.text!r} names records that were not emitted: {', '.join(missing)}"
            )
        recs = [records[key] for key in item.records]
        try:
            decided = verdict(item.kind, recs)
        except ClaimError as exc:
            raise ClaimError(f"claim {item.text!r}: {exc}") from exc
        rows.append(
            ClaimRow(
                claim=item.text,
                kind=item.kind,
                paper=item.paper,
                measured=measured_text(recs),
                verdict=decided,
                records=item.records,
            )
        )
    return rows


def _cell(value: object) -> str:
    if value is None:
        return ""
    text = _num(value) if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rows: Sequence[ClaimRow]) -> str:
    """Return the claims rows as a markdown table (texts in full)."""
    lines = ["| claim | kind | paper | measured here | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        verdict_text = f"**{row.verdict}**" if row.verdict == REPRODUCED else row.verdict
        lines.append(
            f"| {_cell(row.claim)} | {row.kind} | {_cell(row.paper)} | {_cell(row.measured)} "
            f"| {verdict_text} |"
        )
    return "\n".join(lines)


def _plain(rows: Sequence[ClaimRow]) -> str:
    out = []
    for i, row in enumerate(rows, 1):
        paper = f" (paper: {_cell(row.paper)})" if row.paper is not None else ""
        out.append(f"{i}. {row.claim}{paper}\n   measured: {row.measured}\n   -> {row.verdict}")
    return "\n".join(out)


def claims_table() -> None:
    """Display every claim of this notebook with its verdict and emit them as JSON.

    Displays a markdown table (claim · kind · paper · measured here · verdict) and emits
    the rows as an ``application/vnd.hpcnb.claims+json`` output. Returns nothing, so the
    table is not echoed twice.

    Raises:
        ClaimError: No claim was stated, or a claim names a record that was not emitted.
    """
    rows = evaluate_claims()
    if not rows:
        raise ClaimError("no claims stated: call claim(...) before claims_table()")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    markdown = render_markdown(rows) + f"\n\n{len(rows)} claims: {summary}."
    emit(
        _plain(rows) + f"\n{len(rows)} claims: {summary}.",
        {"text/markdown": markdown, CLAIMS_MIME: [row.to_json() for row in rows]},
    )


def read_claims(path: str | Path) -> list[dict[str, Any]]:
    """Return the claims rows of an executed notebook (from its claims outputs).

    When a notebook displays several claims tables, rows are merged by claim text and
    the later output wins.

    Raises:
        FileNotFoundError: The file does not exist.
        RecordError: The file is not a notebook.
        ClaimError: A claims output is malformed.
    """
    path = Path(path)
    nb = load_notebook(path)
    merged: dict[str, dict[str, Any]] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            payload = output.get("data", {}).get(CLAIMS_MIME)
            if payload is None:
                continue
            if isinstance(payload, str):
                payload = json.loads(payload)
            if not isinstance(payload, list):
                raise ClaimError(f"{path}, cell {index}: claims output is not a list")
            for row in payload:
                if not isinstance(row, dict) or not {"claim", "verdict", "records"} <= set(row):
                    raise ClaimError(f"{path}, cell {index}: malformed claims row {row!r}")
                merged[row["claim"]] = row
    return list(merged.values())


def audit_claims(rows: Iterable[Mapping[str, Any]], records: Mapping[str, Record]) -> list[str]:
    """Check claims rows against the records they name; return the problems found.

    A row must name records that exist, carry the verdict those records imply, and never
    be *reproduced* when one of its records is synthetic or simulated.
    """
    problems = []
    for row in rows:
        text = row.get("claim", "?")
        keys = list(row.get("records", []))
        missing = [k for k in keys if k not in records]
        if not keys or missing:
            problems.append(f"{text!r}: names missing records {missing or '(none named)'}")
            continue
        recs = [records[k] for k in keys]
        if row.get("verdict") not in VERDICTS:
            problems.append(f"{text!r}: verdict {row.get('verdict')!r} is not in the vocabulary")
        try:
            expected = verdict(row.get("kind", "paper"), recs)
        except ClaimError as exc:
            problems.append(f"{text!r}: {exc}")
            continue
        if row.get("verdict") != expected:
            problems.append(f"{text!r}: verdict {row.get('verdict')!r}, records imply {expected!r}")
        if row.get("verdict") == REPRODUCED and any(r.source != "real" for r in recs):
            problems.append(f"{text!r}: reproduced on {', '.join(r.source for r in recs)} data")
    return problems
