"""Standard Workload Format (SWF 2.x) reader and writer.

An SWF file holds one job per line with 18 whitespace-separated numeric fields and
header comments starting with ``;`` (``; MaxNodes: 240``). ``-1`` means unknown.
Files may be gzip-compressed (``.swf.gz``). A malformed line is reported as
``file:line`` and, by default, raises :class:`SWFError`; with ``on_error="skip"`` the
line is skipped and listed in :attr:`SWFTrace.skipped`.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["SWF_FIELDS", "SWFError", "SWFTrace", "read_swf", "write_swf"]

SWF_FIELDS: tuple[str, ...] = (
    "job_id",
    "submit_time",
    "wait_time",
    "run_time",
    "allocated_processors",
    "average_cpu_time",
    "used_memory",
    "requested_processors",
    "requested_time",
    "requested_memory",
    "status",
    "user_id",
    "group_id",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_time",
)


class SWFError(ValueError):
    """A malformed SWF line; the message starts with ``file:line``."""


@dataclass
class SWFTrace:
    """The content of an SWF file.

    Attributes:
        fields: One float64 array per SWF field name (see :data:`SWF_FIELDS`), all of
            the same length; ``-1`` marks unknown values as in the file.
        header: Header metadata ``{key: value}`` from ``; Key: value`` comment lines
            (repeated keys such as ``Queue`` keep the last value; all lines are kept in
            :attr:`header_lines`).
        header_lines: Every comment line without the leading ``;``.
        skipped: ``"file:line: reason"`` for each malformed line skipped.
        source: Where the trace was read from.
    """

    fields: dict[str, np.ndarray]
    header: dict[str, str] = field(default_factory=dict)
    header_lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    source: str = "<memory>"

    def __len__(self) -> int:
        return len(self.fields["job_id"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]

    def header_int(self, key: str) -> int | None:
        """Return an integer header value (``MaxNodes``), or ``None`` when absent."""
        value = self.header.get(key)
        if value is None:
            return None
        try:
            return int(float(value.split()[0]))
        except (ValueError, IndexError):
            return None

    def machine_size(self) -> int | None:
        """Return ``MaxProcs`` or else ``MaxNodes`` from the header (one processor = one node)."""
        return self.header_int("MaxProcs") or self.header_int("MaxNodes")

    def select(self, mask: np.ndarray) -> SWFTrace:
        """Return a trace with only the rows where ``mask`` is true (header kept)."""
        return SWFTrace(
            {k: v[mask] for k, v in self.fields.items()},
            dict(self.header),
            list(self.header_lines),
            list(self.skipped),
            self.source,
        )

    def head(self, n: int) -> SWFTrace:
        """Return the first ``n`` jobs."""
        mask = np.zeros(len(self), dtype=bool)
        mask[:n] = True
        return self.select(mask)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def read_swf(path: str | Path, on_error: Literal["error", "skip"] = "error") -> SWFTrace:
    """Read an SWF (or gzip-compressed ``.swf.gz``) file.

    Args:
        path: The file.
        on_error: ``"error"`` raises on the first malformed line; ``"skip"`` skips it
            and records ``file:line: reason`` in :attr:`SWFTrace.skipped`.

    Raises:
        FileNotFoundError: The file does not exist.
        SWFError: A malformed line (``file:line: reason``) with ``on_error="error"``.
        ValueError: ``on_error`` is not one of the two policies.
    """
    if on_error not in ("error", "skip"):
        raise ValueError(f"on_error={on_error!r}: expected 'error' or 'skip'")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: SWF file not found")
    rows: list[list[float]] = []
    header: dict[str, str] = {}
    header_lines: list[str] = []
    skipped: list[str] = []
    with _open_text(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith(";"):
                text = line[1:].strip()
                header_lines.append(text)
                key, sep, value = text.partition(":")
                if sep and key.strip() and " " not in key.strip():
                    header[key.strip()] = value.strip()
                continue
            parts = line.split()
            reason = None
            if len(parts) != 18:
                reason = f"expected 18 fields, found {len(parts)}"
            else:
                try:
                    row = [float(p) for p in parts]
                except ValueError:
                    bad = next(p for p in parts if not _is_number(p))
                    reason = f"field {parts.index(bad) + 1} ({SWF_FIELDS[parts.index(bad)]}) "
                    reason += f"is {bad!r}, expected a number"
            if reason is not None:
                message = f"{path}:{lineno}: {reason}"
                if on_error == "error":
                    raise SWFError(message)
                skipped.append(message)
                continue
            rows.append(row)
    data = np.array(rows, dtype=np.float64).reshape(-1, 18)
    fields = {name: data[:, i].copy() for i, name in enumerate(SWF_FIELDS)}
    return SWFTrace(fields, header, header_lines, skipped, str(path))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _format(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}"


def write_swf(trace: SWFTrace, path: str | Path) -> Path:
    """Write a trace as SWF (gzip-compressed when the name ends in ``.gz``).

    Header lines are written first (``; line``), then one line per job.

    Returns:
        The path written.
    """
    path = Path(path)
    lines = [f"; {text}" if text else ";" for text in trace.header_lines]
    if not trace.header_lines:
        lines = [f"; {k}: {v}" for k, v in trace.header.items()]
    columns = [trace.fields[name] for name in SWF_FIELDS]
    for i in range(len(trace)):
        lines.append(" ".join(_format(float(col[i])) for col in columns))
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def trace_from_arrays(
    submit: np.ndarray,
    run_time: np.ndarray,
    processors: np.ndarray,
    requested_time: np.ndarray | None = None,
    header: dict[str, str] | None = None,
) -> SWFTrace:
    """Build an :class:`SWFTrace` from the fields a generator produces.

    Args:
        submit: Submit times (s).
        run_time: Run times (s).
        processors: Allocated (= requested) processors.
        requested_time: Requested times (s); unknown (-1) when omitted.
        header: Header metadata such as ``{"MaxNodes": "256"}``.
    """
    n = len(submit)
    fields = {name: np.full(n, -1.0) for name in SWF_FIELDS}
    fields["job_id"] = np.arange(1, n + 1, dtype=np.float64)
    fields["submit_time"] = np.asarray(submit, dtype=np.float64)
    fields["run_time"] = np.asarray(run_time, dtype=np.float64)
    fields["allocated_processors"] = np.asarray(processors, dtype=np.float64)
    fields["requested_processors"] = np.asarray(processors, dtype=np.float64)
    if requested_time is not None:
        fields["requested_time"] = np.asarray(requested_time, dtype=np.float64)
    fields["status"] = np.ones(n)
    header = dict(header or {})
    return SWFTrace(fields, header, [f"{k}: {v}" for k, v in header.items()])


__all__ += ["trace_from_arrays"]
