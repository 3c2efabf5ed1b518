"""Records: the contract between notebooks, batch runs, tests and readers.

A notebook reports each headline number with :func:`record`. The call shows a readable
line in the notebook and emits a display output of mime type
``application/vnd.hpcnb.record+json`` (the JSON of :class:`Record`, plus ``met``).
:func:`read_records` gets ``{key: value}`` back from an executed notebook and
:func:`read_record_details` the full records.

Keys are ``<area>.<metric>`` in snake_case (``winograd.speedup_vs_torch``). Values are
finite numbers; ratios are plain floats (1.35, not "35%").

**Uncertainty.** ``samples`` (interleaved timing repetitions, seeds, folds) make the value
their median, and the record keeps ``n``, an interval ``[low, high]`` of that median and the
interval's ``coverage``. The interval is the exact distribution-free one from order
statistics (:func:`median_interval`): ``[x_(k), x_(n+1-k)]`` covers the median with
probability ``1 - 2 P(Bin(n, 1/2) < k)``, whatever the distribution. 95 % needs at least 6
samples; with 3 to 5 the record keeps ``[min, max]`` and says its real coverage (75 % to
94 %); with fewer than 3 observations a record carries no interval and says so. An accuracy
on *n* test items gets a binomial Wilson interval through :func:`record_accuracy`.

**Provenance.** ``source`` says where the inputs came from: ``"real"`` (measured on this
machine or read from real data), ``"generated"`` (made on purpose by a published or stated
model: Lublin workloads, replicated mixes, random shapes), ``"synthetic"`` (a stand-in for
missing real data) or ``"simulated"`` (a model's prediction at a scale we cannot run).

**Targets.** A target is a number (the value must equal it) or a comparison string such as
``">= 0.45"``, and ``target_from`` says whose it is: ``"paper"`` (the paper's own figure,
as the notebook scales it) or ``"ours"``. A record whose target is the paper's may carry our
own ``own_target`` beside it (stricter or not). :func:`evaluate_target` is three-valued and one rule
serves equality and threshold targets alike: ``"met"`` only when the whole interval
satisfies the target, ``"not met"`` when none of it does, ``"inconclusive"`` otherwise, and
never ``"met"`` on an interval of less than 95 % coverage or on fewer than 3 observations.
A synthetic record is ``"not tested"`` whatever its value.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.errors import InvalidTypeError, RecordError
from hpcnb.stats import (
    NOMINAL_COVERAGE,
    Estimate,
    median_interval,
    median_interval_coverage,
    wilson_interval,
)

MIME_TYPE = "application/vnd.hpcnb.record+json"
KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
SOURCES = ("real", "generated", "synthetic", "simulated")
TARGET_FROM = ("paper", "ours")
MIN_INTERVAL_N = 3  # fewer observations carry no interval
MET, NOT_MET, INCONCLUSIVE, NOT_TESTED = "met", "not met", "inconclusive", "not tested"
#: Longest text of each record field, in characters (a record is a headline, not a log).
MAX_TEXT = {"key": 120, "unit": 64, "note": 2000, "paper": 500}
#: Colour of each target state (and claim verdict) in the HTML outputs.
STATE_COLOURS = {MET: "#1a7f37", NOT_MET: "#cf222e", INCONCLUSIVE: "#9a6700"}
NEUTRAL_COLOUR = "#57606a"
_TARGET_PATTERN = re.compile(r"^\s*(>=|<=|==|>|<|≥|≤)\s*([-+0-9.eE]+)\s*$")
_SYMBOLS = {"≥": ">=", "≤": "<="}
_SESSION: dict[str, Record] = {}
_ON_CLEAR: list[Callable[[], None]] = []  # layers above (claims) forget their state too

__all__ = [
    "INCONCLUSIVE",
    "MET",
    "MAX_TEXT",
    "MIME_TYPE",
    "MIN_INTERVAL_N",
    "NOMINAL_COVERAGE",
    "NOT_MET",
    "NOT_TESTED",
    "SOURCES",
    "TARGET_FROM",
    "Record",
    "coloured",
    "clear_session",
    "emit",
    "evaluate_target",
    "format_record",
    "format_record_html",
    "plural",
    "load_notebook",
    "on_clear_session",
    "read_record_details",
    "read_records",
    "record",
    "record_accuracy",
    "session_records",
    "target_met",
]


@dataclass(frozen=True)
class Record:
    """One headline number of a notebook.

    Attributes:
        key: ``<area>.<metric>`` in snake_case.
        value: The measured value (finite); the median when ``samples`` were given.
        unit: Unit of the value, empty for plain ratios and counts.
        target: The test of the value: a number or a comparison string (``">= 1.5"``).
        paper: The value the paper reports, as a number or short text.
        n: Number of samples, test items or seeds behind the value (``None``: one value).
        low: Lower end of the interval (``None`` when there is none).
        high: Upper end of the interval.
        source: ``"real"``, ``"generated"``, ``"synthetic"`` or ``"simulated"``.
        note: Free text shown beside the value.
        samples: The repeated measurements, when the value is their median.
        target_from: Whose target it is: ``"paper"`` (the paper's figure) or ``"ours"``.
        own_target: Our own target beside a paper target (``None``: none).
        coverage: The interval's coverage (0.95 nominal; less for a median of 3 to 5
            samples; ``None`` when there is no interval).
    """

    key: str
    value: float
    unit: str = ""
    target: float | str | None = None
    paper: float | str | None = None
    n: int | None = None
    low: float | None = None
    high: float | None = None
    source: str = "real"
    note: str = ""
    samples: tuple[float, ...] = field(default=(), repr=False)
    target_from: str = "ours"
    own_target: float | str | None = None
    coverage: float | None = None

    def state(self, target: float | str | None) -> str | None:
        """Evaluate ``target`` on this record's value, interval, coverage and source."""
        return evaluate_target(
            self.value,
            target,
            self.low,
            self.high,
            self.source,
            n=self.n,
            coverage=self.coverage,
        )

    @property
    def met(self) -> str | None:
        """``"met"``, ``"not met"``, ``"inconclusive"``, ``"not tested"`` or ``None``."""
        return self.state(self.target)

    @property
    def own_met(self) -> str | None:
        """The state of :attr:`own_target` (``None`` when there is none)."""
        return self.state(self.own_target)

    @property
    def paper_target(self) -> float | str | None:
        """The paper's figure as a target, or ``None`` when the target is ours."""
        return self.target if self.target_from == "paper" else None

    @property
    def our_target(self) -> float | str | None:
        """Our target: :attr:`own_target`, or :attr:`target` when it is ours."""
        if self.own_target is not None:
            return self.own_target
        return self.target if self.target_from == "ours" else None

    @property
    def interval_note(self) -> str:
        """Why the record has no 95 % interval (``""`` when it has one or needs none)."""
        if self.low is None and self.n is not None and self.n < MIN_INTERVAL_N:
            return f"no interval (n={self.n} < {MIN_INTERVAL_N})"
        low_coverage = self.coverage is not None and self.coverage < NOMINAL_COVERAGE - 1e-9
        if self.low is not None and low_coverage:
            return f"interval covers only {self.coverage:.0%}"
        return ""

    def to_json(self) -> dict[str, Any]:
        """Return the record as the JSON payload of the mime bundle (``met`` included)."""
        return {
            "key": self.key,
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "paper": self.paper,
            "n": self.n,
            "low": self.low,
            "high": self.high,
            "source": self.source,
            "note": self.note,
            "samples": list(self.samples),
            "target_from": self.target_from,
            "own_target": self.own_target,
            "coverage": self.coverage,
            "met": self.met,
            "own_met": self.own_met,
        }

    def detail(self) -> dict[str, Any]:
        """Return the entry of ``records_detail.json`` (no samples)."""
        out = self.to_json()
        del out["key"], out["samples"], out["note"]
        return out

    @classmethod
    def from_json(cls, payload: dict[str, Any], where: str = "record") -> Record:
        """Rebuild a record from its mime payload (older payloads lack the new fields).

        Args:
            payload: The ``application/vnd.hpcnb.record+json`` payload.
            where: Where the payload came from, for messages.

        Raises:
            RecordError: A field is missing or of the wrong type.
        """
        try:
            key = payload["key"]
            _check_key(key)
            samples = tuple(float(s) for s in payload.get("samples") or ())
            n = payload.get("n")
            low, high = payload.get("low"), payload.get("high")
            coverage = payload.get("coverage")
            target_from = payload.get("target_from", "ours")
            if target_from not in TARGET_FROM:
                raise RecordError(f"target_from {target_from!r} is not one of {TARGET_FROM}")
            return cls(
                key=key,
                value=_check_value(key, payload["value"]),
                unit=_check_text(key, "unit", payload.get("unit", "")),
                target=_check_target(key, payload.get("target")),
                paper=_check_paper(key, payload.get("paper")),
                n=None if n is None else int(n),
                low=None if low is None else float(low),
                high=None if high is None else float(high),
                source=_check_source(key, payload.get("source", "real")),
                note=_check_text(key, "note", payload.get("note", "")),
                samples=samples,
                target_from=str(target_from),
                own_target=_check_target(key, payload.get("own_target")),
                coverage=None if coverage is None else float(coverage),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: malformed record payload ({exc})") from exc


def _check_text(key: str, field: str, text: object) -> str:
    """Return ``text`` as a string within :data:`MAX_TEXT`, else raise :class:`RecordError`."""
    value = str(text)
    limit = MAX_TEXT[field]
    if len(value) > limit:
        raise RecordError(
            f"record {key[:120]!r}: {field} of {len(value)} characters is longer than {limit}"
        )
    return value


def _check_key(key: str) -> None:
    if isinstance(key, str) and len(key) > MAX_TEXT["key"]:
        raise RecordError(f"record key of {len(key)} characters is longer than {MAX_TEXT['key']}")
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise RecordError(
            f"record key {key!r} is not of the form '<area>.<metric>' in snake_case "
            "(e.g. 'winograd.speedup_vs_torch')"
        )


def _as_float(key: str, value: object, what: str = "value") -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        item = getattr(value, "item", None)  # numpy / torch scalars
        if item is None or getattr(value, "ndim", 0) not in (0, None):
            raise InvalidTypeError(f"record {key!r}: {what} {value!r} is not a real number")
        value = item()
        if not isinstance(value, numbers.Real):
            raise InvalidTypeError(f"record {key!r}: {what} {value!r} is not a real number")
    out = float(value)
    if not math.isfinite(out):
        raise RecordError(f"record {key!r}: {what} {out} is not finite")
    return out


def _check_value(key: str, value: object) -> float:
    return _as_float(key, value)


def _check_target(key: str, target: object) -> float | str | None:
    if target is None:
        return None
    if isinstance(target, str):
        if not _TARGET_PATTERN.match(target):
            raise RecordError(
                f"record {key!r}: target {target!r} is neither a number nor a comparison "
                "such as '>= 0.45'"
            )
        return target
    return _as_float(key, target, "target")


def _check_paper(key: str, paper: object) -> float | str | None:
    if paper is None:
        return None
    if isinstance(paper, str):
        return _check_text(key, "paper", paper)
    return _check_value(key, paper)


def _check_source(key: str, source: object) -> str:
    if source not in SOURCES:
        raise RecordError(f"record {key!r}: source {source!r} is not one of {SOURCES}")
    return str(source)


def _parse_target(target: str) -> tuple[str, float]:
    match = _TARGET_PATTERN.match(target)
    if match is None:
        raise RecordError(f"target {target!r} is not a comparison such as '>= 0.45'")
    return _SYMBOLS.get(match.group(1), match.group(1)), float(match.group(2))


def _holds(op: str, value: float, bound: float) -> bool:
    return {
        ">=": value >= bound,
        "<=": value <= bound,
        ">": value > bound,
        "<": value < bound,
        "==": math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12),
    }[op]


def target_met(value: float, target: float | str | None) -> bool | None:
    """Tell whether a point ``value`` meets ``target`` (no interval, no provenance).

    Args:
        value: The measured value.
        target: A number (equality within 1e-9 relative) or a comparison string.

    Returns:
        ``True``/``False``, or ``None`` when there is no target.
    """
    if target is None:
        return None
    if isinstance(target, str):
        op, bound = _parse_target(target)
        return _holds(op, value, bound)
    return _holds("==", value, float(target))


def evaluate_target(
    value: float,
    target: float | str | None,
    low: float | None = None,
    high: float | None = None,
    source: str = "real",
    *,
    n: int | None = None,
    coverage: float | None = None,
) -> str | None:
    """Three-valued target evaluation, with provenance; one rule for every kind of target.

    With an interval, a target (a bound or an equality) is *met* when every point of the
    interval satisfies it, *not met* when no point does, and *inconclusive* otherwise (an
    equality target whose interval holds the value but also others is inconclusive).
    Without an interval the point value decides. A record is never *met* on an interval
    of less than :data:`NOMINAL_COVERAGE`, nor on fewer than :data:`MIN_INTERVAL_N`
    observations (``n``) without one: where it would be, it is *inconclusive*.

    Args:
        value: The recorded value.
        target: A number or a comparison string; ``None`` means no target.
        low: Lower end of the interval, or ``None``.
        high: Upper end of the interval, or ``None``.
        source: The record's source; ``"synthetic"`` is never tested.
        n: Observations behind the value (``None``: one exact value).
        coverage: The interval's coverage (``None``: nominal).

    Returns:
        ``"met"``, ``"not met"``, ``"inconclusive"``, ``"not tested"``, or ``None``
        when there is no target.
    """
    if target is None:
        return None
    if source == "synthetic":
        return NOT_TESTED
    op, bound = ("==", float(target)) if not isinstance(target, str) else _parse_target(target)
    if low is None or high is None:
        state = MET if _holds(op, value, bound) else NOT_MET
        too_few = n is not None and n < MIN_INTERVAL_N
    else:
        too_few = coverage is not None and coverage < NOMINAL_COVERAGE - 1e-9
        if op == "==":
            inside = low <= bound <= high or _holds(op, low, bound) or _holds(op, high, bound)
            whole = _holds(op, low, bound) and _holds(op, high, bound)
            state = MET if whole else (INCONCLUSIVE if inside else NOT_MET)
        elif _holds(op, low, bound) and _holds(op, high, bound):
            state = MET
        elif not _holds(op, low, bound) and not _holds(op, high, bound):
            state = NOT_MET
        else:
            state = INCONCLUSIVE
    if state == MET and too_few:
        return INCONCLUSIVE
    return state


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def format_record(rec: Record) -> str:
    """Return the one-line human-readable form of a record.

    Example: ``pruning.latency_speedup = 1.29 [1.21, 1.37] (n=7), target >= 1.3 (paper):
    inconclusive``.
    """
    text = f"{rec.key} = {_fmt(rec.value)}{(' ' + rec.unit) if rec.unit else ''}"
    if rec.low is not None and rec.high is not None:
        text += f" [{_fmt(rec.low)}, {_fmt(rec.high)}]"
    if rec.n is not None:
        text += f" (n={rec.n})"
    if rec.interval_note:
        text += f", {rec.interval_note}"
    if rec.target is not None:
        met = rec.met
        origin = "paper's figure" if rec.target_from == "paper" else "ours"
        text += f", target {rec.target} ({origin}): {'NOT met' if met == NOT_MET else met}"
    if rec.own_target is not None:
        met = rec.own_met
        text += f", our own target {rec.own_target}: {'NOT met' if met == NOT_MET else met}"
    if rec.paper is not None:
        text += f"; paper {rec.paper}"
    if rec.source != "real":
        text += f"; {rec.source}" + (" data" if rec.source in ("synthetic", "generated") else "")
    if rec.note:
        text += f"; {rec.note}"
    return text


def plural(count: int, word: str, many: str | None = None) -> str:
    """Return ``"1 claim"`` or ``"2 claims"``: the count with the word in the right number.

    Args:
        count: How many.
        word: The singular.
        many: The plural where it is not ``word + "s"``.
    """
    return f"{count} {word if count == 1 else (many or word + 's')}"


def coloured(text: str, colour: str | None = None) -> str:
    """Return ``text`` HTML-escaped in a bold span of ``colour`` (a state's colour by default).

    A state or verdict without its own colour (``not tested``, ``simulated only``) is grey.

    Args:
        text: The text (a state or verdict).
        colour: A CSS colour; by default the state's own colour.
    """
    colour = colour or STATE_COLOURS.get(text, NEUTRAL_COLOUR)
    return f'<span style="color:{html.escape(colour)};font-weight:bold">{html.escape(text)}</span>'


_HTML_CELL = 'style="text-align:{align};vertical-align:top;padding:0 0.6em{wrap}"'
_NUMERIC = "font-variant-numeric:tabular-nums"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """Return an HTML table; cells are HTML already, columns in ``numeric`` right-aligned.

    Args:
        header: Column titles (plain text, escaped here).
        rows: Cells as HTML (escape their text with :func:`html.escape` first).
        numeric: Indices of the columns aligned right in tabular figures.
    """

    def cell(tag: str, index: int, content: str) -> str:
        number = index in numeric  # numbers right-aligned on one line, texts wrap
        style = _HTML_CELL.format(
            align="right" if number else "left", wrap=";white-space:nowrap" if number else ""
        )
        return f"<{tag} {style}>{content}</{tag}>"

    head = "".join(cell("th", i, html.escape(h)) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return (
        f'<table class="hpcnb" style="{_NUMERIC};border-collapse:collapse">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def format_record_html(rec: Record) -> str:
    """Return a record as a one-row HTML table: ``key = value``, interval, n, target, state.

    The first cell reads as the plain line does (``tour.speedup = 1.29 ms``); the interval
    bounds and ``n`` sit in right-aligned columns, the target state is coloured (see
    :data:`STATE_COLOURS`). Every text is escaped.
    """
    esc = html.escape
    low = "" if rec.low is None else esc(_fmt(rec.low))
    high = "" if rec.high is None else esc(_fmt(rec.high))
    target = ""
    if rec.target is not None:
        origin = "paper" if rec.target_from == "paper" else "ours"
        target = f"{esc(str(rec.target))} ({origin}) {coloured(rec.met or '')}"
    if rec.own_target is not None:
        target += f"; our own {esc(str(rec.own_target))} {coloured(rec.own_met or '')}"
    notes = [rec.interval_note, rec.note]
    if rec.paper is not None:
        notes.append(f"paper {rec.paper}")
    if rec.source != "real":
        notes.append(rec.source)
    unit = f" {esc(rec.unit)}" if rec.unit else ""
    row = [
        f"<code>{esc(rec.key)}</code> = <b>{esc(_fmt(rec.value))}</b>{unit}",
        low,
        high,
        "" if rec.n is None else esc(str(rec.n)),
        target,
        esc("; ".join(n for n in notes if n)),
    ]
    header = ["record", "low", "high", "n", "target", "note"]
    return html_table(header, [row], numeric={1, 2, 3})


def _check_origin(
    key: str, target: float | str | None, target_from: str, own_target: float | str | None
) -> None:
    """Refuse an unknown ``target_from``, a paper target without a figure, a stray own target."""
    if target_from not in TARGET_FROM:
        raise RecordError(
            f"record {key!r}: target_from {target_from!r} is not one of {TARGET_FROM}"
        )
    if target_from == "paper" and target is None:
        raise RecordError(f"record {key!r}: target_from='paper' needs the paper's figure as target")
    if own_target is not None and target_from != "paper":
        raise RecordError(
            f"record {key!r}: own_target is our own target beside the paper's; give the "
            "paper's figure as target with target_from='paper', or our target as target"
        )


def _unpack_estimate(
    key: str,
    estimate: Estimate,
    interval: tuple[float, float] | None,
    n: int | None,
    coverage: float | None,
) -> tuple[float, tuple[float, float] | None, int | None, float | None]:
    """``(value, interval, n, coverage)`` of an Estimate given as a record's value."""
    if interval is not None or n is not None or coverage is not None:
        raise RecordError(
            f"record {key!r}: an Estimate carries its interval, n and coverage; "
            "do not give them again"
        )
    return estimate.value, estimate.interval, estimate.n, estimate.coverage


def _median_parts(
    samples: tuple[float, ...],
) -> tuple[float, float | None, float | None, int, float | None]:
    """``(median, low, high, n, coverage)`` of samples (the order-statistic interval)."""
    median = median_interval(samples)
    n = len(samples)
    coverage = median_interval_coverage(n)[1] if n >= 2 else None
    return median.value, median.low, median.high, n, coverage


def _given_interval(
    key: str,
    value: float,
    interval: tuple[float, float] | None,
    coverage: float | None,
) -> tuple[float | None, float | None, float | None]:
    """``(low, high, coverage)`` of an interval given with a value, checked to hold it."""
    if interval is None:
        if coverage is not None:
            raise RecordError(f"record {key!r}: coverage without an interval")
        return None, None, None
    try:
        low, high = (_as_float(key, b, "interval bound") for b in interval)
    except ValueError as exc:
        raise RecordError(f"record {key!r}: interval must be (low, high)") from exc
    tol = 1e-9 * max(1.0, abs(value))
    if not low - tol <= value <= high + tol:
        raise RecordError(f"record {key!r}: interval [{low}, {high}] does not hold {value}")
    if coverage is None:
        coverage = NOMINAL_COVERAGE
    elif not 0 < coverage < 1:
        raise RecordError(f"record {key!r}: coverage {coverage} is not in (0, 1)")
    return low, high, coverage


def record(
    key: str,
    value: float | Estimate | None = None,
    *,
    samples: Sequence[float] | None = None,
    interval: tuple[float, float] | None = None,
    n: int | None = None,
    unit: str = "",
    target: float | str | None = None,
    target_from: str = "ours",
    own_target: float | str | None = None,
    paper: float | str | None = None,
    source: str = "real",
    note: str = "",
    coverage: float | None = None,
) -> None:
    """Record a headline number: show it and emit it as a machine-readable output.

    Give either ``value`` or ``samples``. A value that is an :class:`~hpcnb.stats.Estimate`
    brings its interval, ``n`` and coverage (``record(key, mape_interval(p, m))``). With
    ``samples`` the value is their median and
    the record carries ``n``, the exact order-statistic interval of the median and its
    coverage (:func:`median_interval`; 95 % from 6 samples on, so a timed record with a
    target takes at least 7 rounds). A value with an interval computed elsewhere (a Wilson
    interval, see :func:`record_accuracy`; a bootstrap) passes ``interval=(low, high)``,
    ``n`` and, when it is not 95 %, ``coverage``. With fewer than 3 observations the record
    carries no interval and says so.

    Inside a Jupyter kernel this displays a mime bundle with a ``text/plain`` line, a
    ``text/html`` table row (:func:`format_record_html`) and the
    ``application/vnd.hpcnb.record+json`` payload; elsewhere it prints the line. It
    returns nothing, so a record at the end of a cell is not echoed; the record is kept
    for :mod:`hpcnb.claims` (see :func:`session_records`).

    Args:
        key: ``<area>.<metric>`` in snake_case.
        value: A finite real number (numpy and torch scalars are accepted), or an
            :class:`~hpcnb.stats.Estimate`, whose interval, ``n`` and coverage it takes.
        samples: Repeated measurements; the value becomes their median.
        interval: ``(low, high)`` of ``value`` when it was computed elsewhere.
        n: Items or repetitions behind ``value`` (set automatically from ``samples``).
        unit: Unit of the value (``"s"``, ``"jobs/s"``); empty for ratios.
        target: The test of the value, a number or a comparison string (``">= 1.5"``).
        target_from: ``"paper"`` when ``target`` is the paper's own figure (scaled to the
            miniature only where the notebook says how), ``"ours"`` otherwise.
        own_target: Our own target beside a paper target (needs
            ``target_from="paper"``); claims judge it as a separate own-design claim.
        paper: The paper's value, a number or short text.
        source: ``"real"``, ``"generated"``, ``"synthetic"`` or ``"simulated"``.
        note: Free text shown beside the value.
        coverage: Coverage of an ``interval`` given here (default 0.95).

    Raises:
        RecordError: The key is malformed, the value not finite, value and samples both
            or neither given, the interval does not hold the value, the target is
            unreadable, its origin unknown, or the source unknown (``RecordError`` is a
            ``ValueError``).
        TypeError: The value is not a real number.
    """
    _check_key(key)
    _check_origin(key, target, target_from, own_target)
    if isinstance(value, Estimate):
        value, interval, n, coverage = _unpack_estimate(key, value, interval, n, coverage)
    if samples is not None:
        if value is not None or interval is not None:
            raise RecordError(f"record {key!r}: give value (with interval) or samples, not both")
        if coverage is not None:
            raise RecordError(f"record {key!r}: the coverage of a median's interval is computed")
        sample_tuple = tuple(_as_float(key, s, "sample") for s in samples)
        value, low, high, n, coverage = _median_parts(sample_tuple)
    elif value is None:
        raise RecordError(f"record {key!r}: give a value or samples")
    else:
        sample_tuple = ()
        value = _check_value(key, value)
        low, high, coverage = _given_interval(key, value, interval, coverage)
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise RecordError(f"record {key!r}: n must be a positive integer, got {n!r}")
    if n is not None and n < MIN_INTERVAL_N:
        low = high = coverage = None  # too few observations for any interval
    rec = Record(
        key=key,
        value=value,
        unit=_check_text(key, "unit", unit),
        target=_check_target(key, target),
        paper=_check_paper(key, paper),
        n=None if n is None else int(n),
        low=low,
        high=high,
        source=_check_source(key, source),
        note=_check_text(key, "note", note),
        samples=sample_tuple,
        target_from=target_from,
        own_target=_check_target(key, own_target),
        coverage=coverage,
    )
    _SESSION[key] = rec
    emit(format_record(rec), {"text/html": format_record_html(rec), MIME_TYPE: rec.to_json()})


def record_accuracy(key: str, correct: int, total: int, **kwargs: Any) -> None:
    """Record an accuracy ``correct / total`` with its Wilson interval and ``n=total``.

    Args:
        key: Record key.
        correct: Items classified right.
        total: Items scored.
        **kwargs: Passed to :func:`record` (``target``, ``paper``, ``source``, ...).
    """
    try:
        proportion = wilson_interval(int(correct), int(total))
    except ValueError as exc:
        raise RecordError(f"record {key!r}: {exc}") from None
    record(key, proportion, **kwargs)


def emit(line: str, bundle: dict[str, Any]) -> None:
    """Display ``bundle`` with ``line`` as its plain text in a kernel; print elsewhere.

    Args:
        line: The plain-text line.
        bundle: The other mime types of the display output.
    """
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency
        print(line)
        return
    if get_ipython() is None:
        print(line)
    else:
        display({**bundle, "text/plain": line}, raw=True)


def session_records() -> dict[str, Record]:
    """Return the records emitted in this process so far, by key (the last one wins)."""
    return dict(_SESSION)


def clear_session() -> None:
    """Forget the records (and claims) emitted in this process."""
    _SESSION.clear()
    for hook in _ON_CLEAR:
        hook()


def on_clear_session(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`clear_session` runs (claims register their reset here)."""
    if hook not in _ON_CLEAR:
        _ON_CLEAR.append(hook)


def load_notebook(path: Path) -> dict[str, Any]:
    """Read an ``.ipynb`` file as JSON.

    Raises:
        RecordError: The file is not valid JSON.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not a notebook (invalid JSON: {exc})") from exc


def read_record_details(path: str | Path) -> list[Record]:
    """Return every record emitted by an executed notebook, in cell order.

    Args:
        path: An executed ``.ipynb`` file.

    Raises:
        FileNotFoundError: The file does not exist.
        RecordError: The file is not a notebook, a payload is malformed, or a key was
            recorded twice.
    """
    path = Path(path)
    nb = load_notebook(path)
    out: list[Record] = []
    seen: dict[str, int] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            payload = output.get("data", {}).get(MIME_TYPE)
            if payload is None:
                continue
            if isinstance(payload, str):
                payload = json.loads(payload)
            rec = Record.from_json(payload, f"{path}, cell {index}")
            if rec.key in seen:
                raise RecordError(
                    f"{path}: record {rec.key!r} emitted twice (cells {seen[rec.key]} and {index})"
                )
            seen[rec.key] = index
            out.append(rec)
    return out


def read_records(path: str | Path) -> dict[str, float]:
    """Return ``{key: value}`` of every record in an executed notebook.

    Args:
        path: An executed ``.ipynb`` file.
    """
    return {rec.key: rec.value for rec in read_record_details(path)}
