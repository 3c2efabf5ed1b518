"""Claims: verdicts computed in one place from the records a notebook emitted.

A notebook states each claim once, naming the records that test it::

    claim("pruning halves FLOPs with < 1 % accuracy loss",
          records=["pruning.flops_ratio", "pruning.accuracy_drop"], paper="-0.2 % at 50 %",
          baseline="uniform pruning at the same FLOPs",
          explanation="at 32x32 the per-call overhead dominates ...")
    claims_table()
    reproducibility_summary(deviations=[...], hard=[...])

:func:`claims_table` reads the records already emitted in this kernel
(:func:`hpcnb.records.session_records`) and decides each verdict from their targets,
intervals and sources only, so a record and its claims row can never disagree.

**What a claim is judged on.** A ``paper`` claim is judged on the targets that are the
paper's own figure (records with ``target_from="paper"``). Where the claim gives the
paper's figure (``paper=``), records that carry only our targets are refused: the claim
would test something the paper did not say. Where the paper gives no figure
(``paper=None``), the claim is judged on our targets and the row says so. Our own
targets beside a paper target (``own_target=``) become their own ``own design`` row right
after the paper claim. An ``own design`` claim is judged on our targets and shows *met*,
*not met* or *inconclusive*, never a neutral word.

The verdict vocabulary is fixed (:data:`VERDICTS`):

* ``by construction`` — the claim's kind says the value is set by a parameter;
* ``not tested (synthetic data)`` — a record rests on a synthetic stand-in;
* ``simulated only`` — a record is a model's prediction (``source="simulated"``);
* ``reproduced`` / ``not reproduced`` / ``inconclusive`` — a paper claim whose targets are
  all met / one of them missed (its whole interval) / otherwise;
* ``met`` / ``not met`` / ``inconclusive`` — the same for an own-design claim;
* ``not tested (smoke inputs)`` — a paper claim in a ``SMOKE=True`` run: the runner sets
  :data:`SMOKE_ENV` in the kernel's environment, and miniature inputs say nothing about the
  paper's figure either way (own-design claims keep *met*, *not met*, *inconclusive*).

A claim's ``explanation`` (what was measured, why it differs, what a larger machine would
show) is printed in the table whenever its verdict is not a success. Where the runner
passes the record history of earlier runs of the same notebook on the same machine
(:mod:`hpcnb.history`), the measured column shows the values that moved between runs.

The table is displayed (plain text, markdown and an HTML table with coloured verdicts) and
emitted as an ``application/vnd.hpcnb.claims+json`` output, which ``hpcnb run`` collects
into ``claims.json``; :func:`claims_frame` returns the same rows as a pandas DataFrame.
"""

from __future__ import annotations

import html
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcnb.errors import ClaimError
from hpcnb.records import (
    INCONCLUSIVE,
    KEY_PATTERN,
    MET,
    MIN_INTERVAL_N,
    NOT_MET,
    STATE_COLOURS,
    Record,
    coloured,
    emit,
    html_table,
    load_notebook,
    on_clear_session,
    plural,
    session_records,
)

if TYPE_CHECKING:
    import pandas as pd

CLAIMS_MIME = "application/vnd.hpcnb.claims+json"
KINDS = ("paper", "own design", "by construction")
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_TESTED_SYNTHETIC = "not tested (synthetic data)"
NOT_TESTED_SMOKE = "not tested (smoke inputs)"
#: Environment variable the runner sets to ``"1"`` in the kernel of a ``SMOKE=True`` run.
SMOKE_ENV = "HPCNB_SMOKE_RUN"
SIMULATED_ONLY = "simulated only"
BY_CONSTRUCTION = "by construction"
OWN_DESIGN = "own design"
VERDICTS = (
    REPRODUCED,
    NOT_REPRODUCED,
    INCONCLUSIVE,
    MET,
    NOT_MET,
    NOT_TESTED_SYNTHETIC,
    NOT_TESTED_SMOKE,
    SIMULATED_ONLY,
    BY_CONSTRUCTION,
)
SUCCESS = (REPRODUCED, MET, BY_CONSTRUCTION)
JUDGED_ON_PAPER = "the paper's figure"
JUDGED_ON_OURS_NO_FIGURE = "our target (the paper gives no figure)"
JUDGED_ON_OURS = "our target"
OWN_TARGET_SUFFIX = " (our own target)"
_CLAIMS: dict[str, Claim] = {}

__all__ = [
    "CLAIMS_MIME",
    "KINDS",
    "NOT_TESTED_SMOKE",
    "SMOKE_ENV",
    "SUCCESS",
    "VERDICTS",
    "Claim",
    "ClaimRow",
    "audit_claims",
    "claim",
    "claims_frame",
    "claims_table",
    "clear_claims",
    "evaluate_claims",
    "measured_text",
    "paper_claims_judged_on_own_targets",
    "read_claims",
    "reproducibility_summary",
    "session_claims",
    "smoke_run",
    "verdict",
]


@dataclass(frozen=True)
class Claim:
    """A claim as the notebook states it.

    Attributes:
        text: The claim, in full.
        records: Keys of the records that test it.
        paper: The paper's figure (a number or short text), ``None`` where the paper
            gives none (and for our own claims).
        kind: ``"paper"``, ``"own design"`` or ``"by construction"``.
        baseline: What the claim compares against (``"adaptive speculation"``).
        explanation: The reading of a result that is not a success: what was measured,
            why it differs, what a larger machine or input would show.
        stricter_of: For a row generated from our own targets, the paper claim's text.
    """

    text: str
    records: tuple[str, ...]
    paper: float | str | None = None
    kind: str = "paper"
    baseline: str | None = None
    explanation: str | None = None
    stricter_of: str | None = None


@dataclass(frozen=True)
class ClaimRow:
    """One row of a claims table: a claim with what was measured and its verdict."""

    claim: str
    kind: str
    paper: float | str | None
    measured: str
    verdict: str
    records: tuple[str, ...]
    judged_on: str = ""
    baseline: str | None = None
    explanation: str | None = None
    stricter_of: str | None = None
    smoke: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the row as an entry of ``claims.json``."""
        return {
            "claim": self.claim,
            "kind": self.kind,
            "paper": self.paper,
            "measured": self.measured,
            "verdict": self.verdict,
            "records": list(self.records),
            "judged_on": self.judged_on,
            "baseline": self.baseline,
            "explanation": self.explanation,
            "stricter_of": self.stricter_of,
            "smoke": self.smoke,
        }

    @property
    def reading(self) -> str:
        """The explanation, shown only when the verdict is not a success."""
        if self.verdict in SUCCESS or not self.explanation:
            return ""
        return self.explanation


def claim(
    text: str,
    *,
    records: Sequence[str],
    paper: float | str | None = None,
    kind: str = "paper",
    baseline: str | None = None,
    explanation: str | None = None,
) -> None:
    """State a claim tested by ``records`` (keys recorded before :func:`claims_table`).

    Stating the same text again (re-running a cell) replaces the earlier claim.

    Args:
        text: The claim, in full.
        records: Record keys; at least one.
        paper: The paper's figure for this claim (``"2.15x at 8 nodes"``, ``0.35``);
            ``None`` where the paper gives no figure. A ``paper`` claim with a figure is
            judged only on records whose target is that figure (``target_from="paper"``).
        kind: ``"paper"`` (the paper's claim), ``"own design"`` (ours) or
            ``"by construction"`` (set by a parameter).
        baseline: What the claim compares against; a paper claim names the strongest
            baseline of the kind the paper compared against.
        explanation: The reading printed when the verdict is not a success.

    Raises:
        ClaimError: Empty text, no records, a malformed key, an unknown kind, an empty
            baseline or explanation; or, when its records were already emitted, a claim
            that cannot be judged on them (a paper claim that gives the paper's figure but
            whose records carry only our targets, a claim none of whose records has a
            target). Otherwise :func:`claims_table` checks the same.
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
    for name, value in (("baseline", baseline), ("explanation", explanation)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ClaimError(f"claim {text!r}: {name} must be a non-empty string or None")
    if paper is not None and not isinstance(paper, str):
        paper = float(paper)
    item = Claim(
        text=text,
        records=keys,
        paper=paper,
        kind=kind,
        baseline=baseline,
        explanation=explanation,
    )
    emitted = session_records()
    if all(key in emitted for key in keys):  # judge now, so a bad claim fails where stated
        try:
            judge(item, [emitted[key] for key in keys])
        except ClaimError as exc:
            raise ClaimError(f"claim {text!r}: {exc}") from None
    _CLAIMS[text] = item


def session_claims() -> list[Claim]:
    """Return the claims stated in this process, in order."""
    return list(_CLAIMS.values())


def clear_claims() -> None:
    """Forget the claims stated in this process."""
    _CLAIMS.clear()


on_clear_session(clear_claims)


def _states(records: Sequence[Record], which: str) -> list[str | None]:
    if which == "paper":
        return [rec.met for rec in records if rec.paper_target is not None]
    if which == "own":
        return [rec.own_met for rec in records if rec.own_target is not None]
    # ours: our target where there is one, else the record's target whoever set it
    return [
        rec.state(rec.our_target if rec.our_target is not None else rec.target)
        for rec in records
        if rec.target is not None
    ]


def _combine(states: Sequence[str | None], success: str, failure: str) -> str:
    if NOT_MET in states:
        return failure
    if states and all(state == MET for state in states):
        return success
    return INCONCLUSIVE


def smoke_run() -> bool:
    """Whether this process runs a notebook with ``SMOKE=True`` (:data:`SMOKE_ENV` is ``"1"``)."""
    return os.environ.get(SMOKE_ENV) == "1"


def judge(item: Claim, records: Sequence[Record], *, smoke: bool = False) -> tuple[str, str]:
    """Return ``(verdict, what it was judged on)`` for a claim and its records.

    Args:
        item: The claim.
        records: Its records, in the claim's order.
        smoke: The run used smoke inputs: a paper claim is then *not tested (smoke
            inputs)* where it would otherwise be reproduced, not reproduced or inconclusive.

    Raises:
        ClaimError: A paper claim that gives the paper's figure but whose records carry
            only our targets; a claim (not by construction) none of whose records has a
            target.
    """
    keys = ", ".join(rec.key for rec in records)
    if item.kind == BY_CONSTRUCTION:
        return BY_CONSTRUCTION, ""
    if item.stricter_of is not None:
        which, judged_on = "own", JUDGED_ON_OURS
    elif item.kind == "paper" and any(rec.paper_target is not None for rec in records):
        which, judged_on = "paper", JUDGED_ON_PAPER
    elif item.kind == "paper" and item.paper is not None:
        raise ClaimError(
            f"the claim gives the paper's figure ({item.paper}) but its records ({keys}) carry "
            "only our targets: record the paper's figure as a target with "
            "target_from='paper' (our own one as own_target), or state the claim "
            "without paper= where the paper gives no figure"
        )
    else:
        which = "ours"
        judged_on = JUDGED_ON_OURS_NO_FIGURE if item.kind == "paper" else JUDGED_ON_OURS
    states = _states(records, which)
    if not states:
        raise ClaimError(
            f"a {item.kind} claim needs a record with a target; none of {keys} has one"
        )
    if any(rec.source == "synthetic" for rec in records):
        return NOT_TESTED_SYNTHETIC, judged_on
    if any(rec.source == "simulated" for rec in records):
        return SIMULATED_ONLY, judged_on
    if item.kind == "paper" and item.stricter_of is None:
        if smoke:
            return NOT_TESTED_SMOKE, judged_on
        return _combine(states, REPRODUCED, NOT_REPRODUCED), judged_on
    return _combine(states, MET, NOT_MET), judged_on


def verdict(
    kind: str,
    records: Sequence[Record],
    paper: float | str | None = None,
    *,
    smoke: bool = False,
) -> str:
    """Return the verdict that ``records`` imply for a claim of ``kind`` (see :func:`judge`).

    Args:
        kind: The claim's kind (``"paper"`` or ``"own"``, see :class:`Claim`).
        records: The records the claim rests on.
        paper: The paper's figure, when the claim gives one.
        smoke: The records come from a ``SMOKE=True`` run (judged as not tested).

    Raises:
        ClaimError: As :func:`judge`.
    """
    keys = tuple(rec.key for rec in records)
    return judge(Claim("claim", keys, paper=paper, kind=kind), records, smoke=smoke)[0]


def _num(value: float) -> str:
    return f"{value:.4g}"


def _target_text(rec: Record, own_targets: bool) -> str:
    if own_targets:
        return f"our own target {rec.own_target}: {rec.own_met}" if rec.own_target else ""
    if rec.target is None:
        return ""
    origin = "paper" if rec.target_from == "paper" else "ours"
    text = f"target {rec.target} ({origin}): {rec.met}"
    if rec.own_target is not None:
        text += f"; our own {rec.own_target}: {rec.own_met}"
    return text


def measured_text(
    records: Sequence[Record],
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    own_targets: bool = False,
) -> str:
    """Return what was measured, record by record, with intervals, targets and sources.

    Args:
        records: The claim's records.
        history: Earlier runs' values by key (:func:`hpcnb.history.session_history`);
            a record whose value moved between runs gets its earlier values appended.
        own_targets: Show our own targets (own_target) instead of the records' targets.
    """
    from hpcnb.history import history_text

    parts = []
    for rec in records:
        text = _num(rec.value) + (f" {rec.unit}" if rec.unit else "")
        if rec.low is not None and rec.high is not None:
            text += f" [{_num(rec.low)}, {_num(rec.high)}]"
        if rec.n is not None:
            text += f" (n={rec.n})"
        if rec.interval_note:
            text += f", {rec.interval_note}"
        target = _target_text(rec, own_targets)
        if target:
            text += f", {target}"
        if rec.source != "real":
            text += f", {rec.source}"
        if history:
            earlier = history_text(rec, history.get(rec.key, ()))
            if earlier:
                text += f"; {earlier}"
        if len(records) > 1:
            text = f"{rec.key.split('.', 1)[1]} = {text}"
        parts.append(text)
    return "; ".join(parts)


def _expanded(claims: Iterable[Claim], records: Mapping[str, Record]) -> list[Claim]:
    """The claims with a generated own-design row after each paper claim with own targets."""
    out: list[Claim] = []
    for item in claims:
        out.append(item)
        if item.kind != "paper":
            continue
        strict = tuple(
            k for k in item.records if k in records and records[k].own_target is not None
        )
        if strict:
            out.append(
                Claim(
                    text=item.text + OWN_TARGET_SUFFIX,
                    records=strict,
                    kind=OWN_DESIGN,
                    baseline=item.baseline,
                    explanation=item.explanation,
                    stricter_of=item.text,
                )
            )
    return out


def evaluate_claims(
    claims: Iterable[Claim] | None = None,
    records: Mapping[str, Record] | None = None,
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    smoke: bool | None = None,
) -> list[ClaimRow]:
    """Compute the rows of the claims table.

    Args:
        claims: The claims (default: those stated in this process).
        records: Records by key (default: those emitted in this process).
        history: Earlier runs' values by record key, shown where they moved.
        smoke: Judge as a run on smoke inputs (default: :func:`smoke_run`).

    Raises:
        ClaimError: A claim names a record that was not emitted, or cannot be judged
            (see :func:`judge`).
    """
    claims = session_claims() if claims is None else list(claims)
    records = session_records() if records is None else records
    smoke = smoke_run() if smoke is None else smoke
    rows = []
    for item in claims:
        missing = [key for key in item.records if key not in records]
        if missing:
            raise ClaimError(
                f"claim {item.text!r} names records that were not emitted: {', '.join(missing)}"
            )
    for item in _expanded(claims, records):
        recs = [records[key] for key in item.records]
        try:
            decided, judged_on = judge(item, recs, smoke=smoke)
        except ClaimError as exc:
            raise ClaimError(f"claim {item.text!r}: {exc}") from exc
        rows.append(
            ClaimRow(
                claim=item.text,
                kind=item.kind,
                paper=item.paper,
                measured=measured_text(recs, history, own_targets=item.stricter_of is not None),
                verdict=decided,
                records=item.records,
                judged_on=judged_on,
                baseline=item.baseline,
                explanation=item.explanation,
                stricter_of=item.stricter_of,
                smoke=smoke,
            )
        )
    return rows


def _cell(value: object) -> str:
    if value is None:
        return ""
    text = _num(value) if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _paper_cell(row: ClaimRow) -> str:
    if row.kind == "paper" and row.paper is None:
        return "the paper gives no figure; our test: see measured"
    return _cell(row.paper)


def _claim_cell(row: ClaimRow) -> str:
    text = _cell(row.claim)
    if row.baseline:
        text += f" (baseline: {_cell(row.baseline)})"
    return text


def render_markdown(rows: Sequence[ClaimRow]) -> str:
    """Return the claims rows as a markdown table (texts in full)."""
    lines = [
        "| claim | kind | paper | measured here | verdict | reading |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        bold = row.verdict in (REPRODUCED, MET)
        verdict_text = f"**{row.verdict}**" if bold else row.verdict
        lines.append(
            f"| {_claim_cell(row)} | {row.kind} | {_paper_cell(row)} | {_cell(row.measured)} "
            f"| {verdict_text} | {_cell(row.reading)} |"
        )
    return "\n".join(lines)


_VERDICT_COLOURS = {REPRODUCED: STATE_COLOURS[MET], NOT_REPRODUCED: STATE_COLOURS[NOT_MET]}


def render_html(rows: Sequence[ClaimRow]) -> str:
    """Return the claims rows as an HTML table: texts escaped, verdicts coloured.

    Reproduced and met are green, not reproduced and not met red, inconclusive amber,
    the other verdicts grey.
    """
    esc = html.escape
    body = [
        [
            esc(row.claim)
            + (f"<br><small>baseline: {esc(row.baseline)}</small>" if row.baseline else ""),
            esc(row.kind),
            esc(_paper_cell(row).replace("\\|", "|")),
            "<br>".join(esc(part) for part in row.measured.split("; ")),
            coloured(row.verdict, _VERDICT_COLOURS.get(row.verdict)),
            esc(row.reading),
        ]
        for row in rows
    ]
    header = ["claim", "kind", "paper", "measured here", "verdict", "reading"]
    return html_table(header, body, numeric=set())


def _plain(rows: Sequence[ClaimRow]) -> str:
    out = []
    for i, row in enumerate(rows, 1):
        paper = f" (paper: {_paper_cell(row)})" if row.kind == "paper" else ""
        base = f"\n   baseline: {row.baseline}" if row.baseline else ""
        reading = f"\n   reading: {row.reading}" if row.reading else ""
        out.append(
            f"{i}. [{row.kind}] {row.claim}{paper}{base}\n   measured: {row.measured}"
            f"\n   -> {row.verdict}{reading}"
        )
    return "\n".join(out)


def _summary_counts(rows: Sequence[ClaimRow]) -> str:
    counts = Counter(row.verdict for row in rows)
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def _summary(rows: Sequence[ClaimRow]) -> str:
    """``"2 claims: 1 met, 1 inconclusive."``, saying so first in a smoke run."""
    text = f"{plural(len(rows), 'claim')}: {_summary_counts(rows)}."
    if any(row.smoke for row in rows):
        text = "SMOKE run: paper claims are not tested on smoke inputs. " + text
    return text


def claims_table() -> None:
    """Display every claim of this notebook with its verdict and emit them as JSON.

    Displays the table (claim · kind · paper · measured here · verdict · reading) as plain
    text, markdown and HTML (verdicts coloured) and emits the rows as an
    ``application/vnd.hpcnb.claims+json`` output. Returns nothing, so the table is not
    echoed twice; :func:`claims_frame` returns the rows as a DataFrame.

    Raises:
        ClaimError: No claim was stated, or a claim names a record that was not emitted.
    """
    from hpcnb.history import session_history

    rows = evaluate_claims(history=session_history())
    if not rows:
        raise ClaimError("no claims stated: call claim(...) before claims_table()")
    summary = _summary(rows)
    emit(
        _plain(rows) + "\n" + summary,
        {
            "text/markdown": render_markdown(rows) + "\n\n" + summary,
            "text/html": render_html(rows) + f"<p>{html.escape(summary)}</p>",
            CLAIMS_MIME: [row.to_json() for row in rows],
        },
    )


def claims_frame() -> pd.DataFrame:
    """Return the claims of this notebook with their verdicts as a pandas DataFrame.

    One row per claims-table row, with the columns of ``claims.json`` (claim, kind,
    paper, measured, verdict, records, judged_on, baseline, explanation, stricter_of,
    smoke). Nothing is displayed.

    Raises:
        ClaimError: As :func:`claims_table`.
    """
    import pandas as pd

    from hpcnb.history import session_history

    rows = evaluate_claims(history=session_history())
    if not rows:
        raise ClaimError("no claims stated: call claim(...) before claims_frame()")
    return pd.DataFrame([row.to_json() for row in rows])


def _bullets(title: str, items: Sequence[str]) -> list[str]:
    return [f"**{title}**", "", *[f"- {item}" for item in items], ""] if items else []


def reproducibility_summary(*, deviations: Sequence[str] = (), hard: Sequence[str] = ()) -> str:
    """Display (and return) the reproducibility summary of this notebook's claims.

    Counts the paper claims by verdict and our own targets by state, lists every paper
    claim that was not reproduced with its reading, then the deviations from the paper's
    set-up and what was hard, as the notebook states them.

    Args:
        deviations: Where the miniature differs from the paper (scale, data, baselines).
        hard: What was hard to reproduce.

    Returns:
        The summary as markdown.

    Raises:
        ClaimError: As :func:`evaluate_claims`; or no claim was stated.
    """
    rows = evaluate_claims()
    if not rows:
        raise ClaimError("no claims stated: call claim(...) before reproducibility_summary()")
    paper = [row for row in rows if row.kind == "paper"]
    ours = [row for row in rows if row.kind == OWN_DESIGN]
    lines = ["### Reproducibility summary", ""]
    lines.append(
        f"Paper claims tested: {len(paper)} ({_summary_counts(paper) or 'none'}). "
        f"Our own targets: {len(ours)} ({_summary_counts(ours) or 'none'})."
    )
    lines.append("")
    smoke = [row for row in paper if row.verdict == NOT_TESTED_SMOKE]
    if smoke:
        lines += [
            f"SMOKE run: {plural(len(smoke), 'paper claim')} not tested on smoke inputs; "
            "a run without SMOKE tests them.",
            "",
        ]
    missing = [
        f"*{row.claim}* — {row.verdict}" + (f": {row.reading}" if row.reading else "")
        for row in paper
        if row.verdict not in (*SUCCESS, NOT_TESTED_SMOKE)
    ]
    lines += _bullets("Paper claims not reproduced here", missing)
    lines += _bullets("Deviations from the paper", list(deviations))
    lines += _bullets("What was hard", list(hard))
    text = "\n".join(lines).rstrip() + "\n"
    emit(text, {"text/markdown": text})
    return text


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


def paper_claims_judged_on_own_targets(rows: Iterable[Mapping[str, Any]]) -> int:
    """Count paper claims that give the paper's figure but were judged on other targets."""
    return sum(
        1
        for row in rows
        if row.get("kind") == "paper"
        and row.get("paper") is not None
        and row.get("verdict") != BY_CONSTRUCTION
        and row.get("judged_on") != JUDGED_ON_PAPER
    )


def audit_claims(rows: Iterable[Mapping[str, Any]], records: Mapping[str, Record]) -> list[str]:
    """Check claims rows against the records they name; return the problems found.

    A row must name records that exist and carry the verdict those records imply (a row
    with ``"smoke": true`` comes from a ``SMOKE=True`` run and is judged as such); a paper
    claim that gives the paper's figure must rest on paper-figure targets only; no record
    with fewer than 3 observations may carry an interval; no row is *reproduced* or *met*
    when one of its records is synthetic or simulated.

    Args:
        rows: Claims rows as written to ``claims.json`` (one per claim).
        records: The notebook's records by key.
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
        item = Claim(
            text=str(text),
            records=tuple(keys),
            paper=row.get("paper"),
            kind=row.get("kind", "paper"),
            stricter_of=row.get("stricter_of"),
        )
        try:
            expected, judged_on = judge(item, recs, smoke=row.get("smoke") is True)
        except ClaimError as exc:
            problems.append(f"{text!r}: {exc}")
            continue
        if row.get("verdict") != expected:
            problems.append(f"{text!r}: verdict {row.get('verdict')!r}, records imply {expected!r}")
        if paper_claims_judged_on_own_targets([{**row, "judged_on": judged_on}]):
            problems.append(f"{text!r}: a paper claim with a figure judged on {judged_on}")
        for rec in recs:
            if rec.n is not None and rec.n < MIN_INTERVAL_N and rec.low is not None:
                problems.append(f"{text!r}: {rec.key} has an interval from n={rec.n}")
        if row.get("verdict") in (REPRODUCED, MET) and any(
            r.source in ("synthetic", "simulated") for r in recs
        ):
            problems.append(
                f"{text!r}: {row.get('verdict')} on {', '.join(r.source for r in recs)} data"
            )
    return problems
