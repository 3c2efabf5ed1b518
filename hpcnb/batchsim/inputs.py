"""Bounded reading of ElastiSim input files: limits, the error type and typed field checks.

Every problem with an ElastiSim input raises :class:`WorkloadError` naming the file
and the JSON path of the value (``jobs.json: jobs[3].arguments.alpha: ...``). Files
are read within the :class:`ElastiSimLimits`: a byte limit per file, checked before
reading, and a JSON nesting limit, checked on the text before it is parsed (a linear
scan that skips strings), so neither a huge nor a deeply nested file can exhaust
memory or Python's recursion limit. ``NaN``, ``Infinity`` and numbers above 1.8e308
parse but are refused by the field checks with their path.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcnb.batchsim.expressions import ExpressionLimits
from hpcnb.errors import HpcnbError, InvalidInputError, InvalidTypeError

__all__ = ["ElastiSimLimits", "WorkloadError", "child_path", "load_json"]


class WorkloadError(HpcnbError, ValueError):
    """An ElastiSim input (jobs, application model, configuration, platform) is invalid.

    Attributes:
        file: The file with the problem.
        path: JSON path of the value (``jobs[3].arguments.alpha``); empty for the file.
        reason: What is wrong and what was expected.
    """

    def __init__(self, file: str | Path, path: str, reason: str) -> None:
        self.file = str(file)
        self.path = path
        self.reason = reason
        super().__init__(": ".join(part for part in (self.file, path, reason) if part))


@dataclass(frozen=True)
class ElastiSimLimits:
    """Bounds that keep reading and simulating an ElastiSim input small and fast.

    Attributes:
        max_file_bytes: Largest JSON file read (bytes).
        max_platform_bytes: Largest platform XML file read (bytes); ElastiSim platforms
            describe a cluster in a few elements, and parsing time grows with the size.
        max_json_depth: Deepest nesting of JSON arrays and objects.
        max_iterations: Largest iteration count of one phase or task, and of all phases
            of one job together. Iterations are modelled analytically, so this bounds
            the simulated times, not memory.
        max_units: Most scheduling points (phase iterations simulated one by one) of one
            job. Resizable jobs (malleable, evolving, adaptive) have one per iteration; a
            rigid or moldable job with more iterations than this runs each phase as one
            block (see :mod:`hpcnb.batchsim.elastisim`).
        max_segments: Most segments one unit of work is expanded into; a repeated task
            list that would exceed it is aggregated in closed form.
        expression: Limits of the expressions in the application models.
    """

    max_file_bytes: int = 64 * 2**20
    max_platform_bytes: int = 2 * 2**20
    max_json_depth: int = 64
    max_iterations: int = 10**15
    max_units: int = 100_000
    max_segments: int = 10_000
    expression: ExpressionLimits = field(default_factory=ExpressionLimits)

    def __post_init__(self) -> None:
        for name in (
            "max_file_bytes",
            "max_platform_bytes",
            "max_json_depth",
            "max_iterations",
            "max_units",
            "max_segments",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"ElastiSimLimits.{name}={value!r}: expected an integer >= 1"
                )
        if not isinstance(self.expression, ExpressionLimits):
            raise InvalidTypeError(
                f"ElastiSimLimits.expression={self.expression!r}: expected an ExpressionLimits"
            )


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CHUNK = 1 << 22


def json_depth(text: str) -> int:
    """Return the deepest nesting of ``[`` / ``{`` in JSON text (strings skipped); linear."""
    data = np.frombuffer(_STRING.sub('""', text).encode("utf-8", "surrogatepass"), np.uint8)
    deepest = carry = 0
    for start in range(0, len(data), _CHUNK):
        chunk = data[start : start + _CHUNK]
        step = (chunk == 91).astype(np.int32) + (chunk == 123) - (chunk == 93) - (chunk == 125)
        if not step.any():
            continue
        depth = np.cumsum(step, dtype=np.int64) + carry
        deepest = max(deepest, int(depth.max()))
        carry = int(depth[-1])
    return deepest


def load_json(path: str | Path, limits: ElastiSimLimits) -> Any:
    """Read a JSON file within the byte and nesting limits.

    Args:
        path: The JSON file.
        limits: Its largest size (``max_file_bytes``) and nesting (``max_json_depth``).

    Returns:
        The parsed JSON value.

    Raises:
        WorkloadError: Missing or unreadable file, too large, not UTF-8, nested too
            deeply or not valid JSON (with line and column).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise WorkloadError(
                path,
                "",
                f"{size:,} bytes; at most {limits.max_file_bytes:,} "
                "are read (ElastiSimLimits.max_file_bytes)",
            )
        with path.open("rb") as handle:
            raw = handle.read(size)
            grew = handle.read(1)
    except FileNotFoundError:
        raise WorkloadError(path, "", "file not found") from None
    except OSError as exc:
        raise WorkloadError(path, "", f"cannot read the file ({exc.strerror or exc})") from None
    if grew:
        raise WorkloadError(path, "", "the file grew while it was read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, "", f"not UTF-8 text (byte {exc.start})") from None
    depth = json_depth(text)
    if depth > limits.max_json_depth:
        most = f"{limits.max_json_depth} allowed (ElastiSimLimits.max_json_depth)"
        raise WorkloadError(path, "", f"JSON nested {depth} levels deep; at most {most}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise WorkloadError(path, "", f"invalid JSON at {where}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise WorkloadError(path, "", f"invalid JSON: {str(exc)[:200]}") from None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")


def child_path(path: str, key: str | int) -> str:
    """Return the JSON path of ``key`` under ``path`` (``jobs[3]``, ``arguments.alpha``).

    Args:
        path: JSON path of the parent (empty for the document).
        key: A list index or an object key (quoted unless it is an identifier).
    """
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key[:60])}]"


def describe(value: Any) -> str:
    """Return a short description of a JSON value for messages."""
    if isinstance(value, list | dict):
        return f"a {'list' if isinstance(value, list) else 'object'} of {len(value)} item(s)"
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def number(value: Any, file: str | Path, path: str, *, minimum: float | None = None) -> float:
    """Return a JSON value as a finite float.

    Args:
        value: The parsed JSON value.
        file: The file it comes from, for the message.
        path: Its JSON path, for the message.
        minimum: Smallest value accepted, if any.

    Raises:
        WorkloadError: Not a number (booleans, strings and lists are not), not finite,
            above 1.8e308 or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkloadError(file, path, f"expected a number, found {describe(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise WorkloadError(
            file, path, f"expected a finite number (below 1.8e308), found {describe(value)}"
        )
    if minimum is not None and result < minimum:
        raise WorkloadError(
            file, path, f"expected a number >= {minimum:g}, found {describe(value)}"
        )
    return result


def integer(value: Any, file: str | Path, path: str, *, minimum: int = 0) -> int:
    """Return a JSON value as an integer (``4`` or ``4.0``, not ``4.5``) >= ``minimum``.

    Args:
        value: The parsed JSON value.
        file: The file it comes from, for the message.
        path: Its JSON path, for the message.
        minimum: Smallest value accepted.

    Raises:
        WorkloadError: Not an integral finite number, or below ``minimum``.
    """
    result = number(value, file, path)
    if result != math.floor(result):
        raise WorkloadError(file, path, f"expected an integer, found {describe(value)}")
    if result < minimum:
        raise WorkloadError(
            file, path, f"expected an integer >= {minimum}, found {describe(value)}"
        )
    return value if isinstance(value, int) else int(result)


def boolean(value: Any, file: str | Path, path: str) -> bool:
    """Return a JSON ``true`` / ``false`` (``0`` / ``1`` accepted).

    Args:
        value: The parsed JSON value.
        file: The file it comes from, for the message.
        path: Its JSON path, for the message.

    Raises:
        WorkloadError: Anything else.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise WorkloadError(file, path, f"expected true or false, found {describe(value)}")
