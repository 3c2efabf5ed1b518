"""Records: the contract between notebooks, batch runs, tests and benchmarks.

A notebook reports each headline number with :func:`record`. The call shows a readable
line in the notebook and emits a display output of mime type
``application/vnd.hpcnb.record+json`` holding ``{"key", "value", "unit", "target",
"paper"}``. :func:`read_records` gets ``{key: value}`` back from an executed notebook.

Keys are ``<area>.<metric>`` in snake_case (``winograd.speedup_vs_torch``). Values are
finite numbers; ratios are plain floats (1.35, not "35%").

A *target* is either a number (the value must equal it) or a comparison string such as
``">= 0.45"``, ``"<= 1e-6"``, ``"> 1"``; :func:`target_met` evaluates it.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIME_TYPE = "application/vnd.hpcnb.record+json"
KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
_TARGET_PATTERN = re.compile(r"^\s*(>=|<=|==|>|<|≥|≤)\s*([-+0-9.eE]+)\s*$")
_SYMBOLS = {"≥": ">=", "≤": "<="}

__all__ = [
    "MIME_TYPE",
    "Record",
    "format_record",
    "read_record_details",
    "read_records",
    "record",
    "target_met",
]


@dataclass(frozen=True)
class Record:
    """One headline number of a notebook.

    Attributes:
        key: ``<area>.<metric>`` in snake_case.
        value: The measured value (finite).
        unit: Unit of the value, empty for plain ratios and counts.
        target: What the issue asks for: a number or a comparison string (``">= 1.5"``).
        paper: The value the paper reports, as a number or short text.
    """

    key: str
    value: float
    unit: str = ""
    target: float | str | None = None
    paper: float | str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the record as the JSON payload of the mime bundle."""
        return asdict(self)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise ValueError(
            f"record key {key!r} is not of the form '<area>.<metric>' in snake_case "
            "(e.g. 'winograd.speedup_vs_torch')"
        )


def _check_value(key: str, value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        # numpy / torch scalars expose item()
        item = getattr(value, "item", None)
        if item is None:
            raise TypeError(f"record {key!r}: value {value!r} is not a real number")
        value = item()
        if not isinstance(value, numbers.Real):
            raise TypeError(f"record {key!r}: value {value!r} is not a real number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"record {key!r}: value {out} is not finite")
    return out


def _check_target(key: str, target: float | str | None) -> float | str | None:
    if target is None:
        return None
    if isinstance(target, str):
        if not _TARGET_PATTERN.match(target):
            raise ValueError(
                f"record {key!r}: target {target!r} is neither a number nor a comparison "
                "such as '>= 0.45'"
            )
        return target
    return _check_value(key, target)


def target_met(value: float, target: float | str | None) -> bool | None:
    """Tell whether ``value`` meets ``target``.

    Args:
        value: The measured value.
        target: A number (equality within 1e-9 relative) or a comparison string.

    Returns:
        ``True``/``False``, or ``None`` when there is no target.
    """
    if target is None:
        return None
    if isinstance(target, str):
        match = _TARGET_PATTERN.match(target)
        if match is None:
            raise ValueError(f"target {target!r} is not a comparison such as '>= 0.45'")
        op = _SYMBOLS.get(match.group(1), match.group(1))
        bound = float(match.group(2))
        return {
            ">=": value >= bound,
            "<=": value <= bound,
            ">": value > bound,
            "<": value < bound,
            "==": math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12),
        }[op]
    return math.isclose(value, float(target), rel_tol=1e-9, abs_tol=1e-12)


def format_record(rec: Record) -> str:
    """Return the one-line human-readable form of a record."""
    value = f"{rec.value:.6g}"
    parts = [f"{rec.key} = {value}{(' ' + rec.unit) if rec.unit else ''}"]
    if rec.target is not None:
        met = target_met(rec.value, rec.target)
        parts.append(f"target {rec.target} ({'met' if met else 'NOT met'})")
    if rec.paper is not None:
        parts.append(f"paper {rec.paper}")
    return "  |  ".join(parts)


def record(
    key: str,
    value: float,
    *,
    unit: str = "",
    target: float | str | None = None,
    paper: float | str | None = None,
) -> Record:
    """Record a headline number: show it and emit it as a machine-readable output.

    Inside a Jupyter kernel this displays a mime bundle with a ``text/plain`` line and
    the ``application/vnd.hpcnb.record+json`` payload; elsewhere it prints the line.

    Args:
        key: ``<area>.<metric>`` in snake_case.
        value: A finite real number (numpy and torch scalars are accepted).
        unit: Unit of the value (``"s"``, ``"jobs/s"``); empty for ratios.
        target: The issue's target, a number or a comparison string (``">= 1.5"``).
        paper: The paper's value, a number or short text.

    Returns:
        The validated :class:`Record`.

    Raises:
        ValueError: The key is malformed, the value not finite, or the target unreadable.
        TypeError: The value is not a real number.
    """
    _check_key(key)
    rec = Record(
        key=key,
        value=_check_value(key, value),
        unit=str(unit),
        target=_check_target(key, target),
        paper=paper if paper is None or isinstance(paper, str) else _check_value(key, paper),
    )
    line = format_record(rec)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency
        print(line)
        return rec
    if get_ipython() is None:
        print(line)
    else:
        display({MIME_TYPE: rec.to_json(), "text/plain": line}, raw=True)
    return rec


def read_record_details(path: str | Path) -> list[Record]:
    """Return every record emitted by an executed notebook, in cell order.

    Args:
        path: An executed ``.ipynb`` file.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is not a notebook, or a key was recorded twice.
    """
    path = Path(path)
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a notebook (invalid JSON: {exc})") from exc
    out: list[Record] = []
    seen: dict[str, int] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            payload = output.get("data", {}).get(MIME_TYPE)
            if payload is None:
                continue
            if isinstance(payload, str):
                payload = json.loads(payload)
            key = payload["key"]
            if key in seen:
                raise ValueError(
                    f"{path}: record {key!r} emitted twice (cells {seen[key]} and {index})"
                )
            seen[key] = index
            out.append(
                Record(
                    key=key,
                    value=float(payload["value"]),
                    unit=payload.get("unit", ""),
                    target=payload.get("target"),
                    paper=payload.get("paper"),
                )
            )
    return out


def read_records(path: str | Path) -> dict[str, float]:
    """Return ``{key: value}`` of every record in an executed notebook.

    Args:
        path: An executed ``.ipynb`` file.
    """
    return {rec.key: rec.value for rec in read_record_details(path)}
