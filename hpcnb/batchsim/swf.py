"""Standard Workload Format (SWF 2.x) reader and writer.

An SWF file holds one job per line with 18 whitespace-separated numeric fields and
header comments starting with ``;`` (``; MaxNodes: 240``). ``-1`` means unknown.
Files may be gzip-compressed (``.swf.gz``). Lines end in a line feed (or CR LF).

**Errors.** Every problem with a file's content raises :class:`SWFFormatError` (an
:class:`~hpcnb.errors.HpcnbError` and a ``ValueError``; :class:`SWFError` is another
name of the same class) with a message that starts with ``file:line``: a line without
18 fields; a field that is not a number, not finite (``nan``, ``inf``) or beyond
``±MAX_FIELD_VALUE`` (2**53, the largest exact integer of a float64); a data line that
is not UTF-8 (comment lines are read with undecodable bytes replaced); a job id already
used on an earlier line (the message names both lines; ids are compared as integers and
checked once the whole file is read); a ``MaxNodes`` / ``MaxProcs`` header beyond
:data:`MAX_NODES`; a truncated or corrupt ``.gz`` stream; a file that is not gzip at
all; and any limit of :class:`SWFLimits`. With ``on_error="skip"`` malformed lines (and
every repetition of a job id after its first line) are skipped and listed in
:attr:`SWFTrace.skipped`; compression errors and limits always raise.

**Limits** (:class:`SWFLimits`, pass ``limits=`` to :func:`read_swf`; every default is
far above the largest published trace): at most ``max_rows`` = 20 million jobs (2.9 GB
of arrays), ``max_bytes`` = 2 GiB of text (counted after decompression, so a gzip bomb
stops there), ``max_line_bytes`` = 64 KiB per line, ``max_header_lines`` = 10,000
comment lines, ``max_messages`` = 1,000 skip messages kept (the count of skipped lines is
:attr:`SWFTrace.skipped_count`) and ``max_skipped`` = 1 million lines skipped at most.

**Memory and speed.** The file is read in blocks of 1 MiB, never as a whole. Each
block's numbers go straight into float64 arrays, one per field, grown in place by 25 %
when full (``realloc``: large arrays are remapped, not copied) and trimmed at the end, so
peak memory is about the final arrays (144 bytes per job, plus 8 for the line numbers
kept in :attr:`SWFTrace.lines`), at most 1.25 times that, plus one block. A
block of plain numbers (digits, sign, point, exponent) is parsed by pandas' C parser;
any other block (comments, stray characters, errors) line by line with Python's
``float``; both give identical values and messages (a fuzz test compares them).

**Jobs larger than the machine** are not this module's concern: the reader keeps every
well-formed line; :func:`~hpcnb.batchsim.workloads.jobs_from_swf` skips and reports
such jobs by default and fails with ``strict=True``, the policy of every reader.
"""

from __future__ import annotations

import gzip
import io
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np

from hpcnb.errors import HpcnbError, InvalidInputError, MissingFileError

__all__ = [
    "DEFAULT_SWF_LIMITS",
    "MAX_FIELD_VALUE",
    "MAX_NODES",
    "SWF_FIELDS",
    "SWFError",
    "SWFFormatError",
    "SWFLimits",
    "SWFTrace",
    "read_swf",
    "trace_from_arrays",
    "write_swf",
]

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

#: Largest machine (nodes) any batchsim reader, the CLI and the compiled kernel accept:
#: node counts stay within a 32-bit signed integer, so no int64 arithmetic can overflow.
MAX_NODES: int = 2**31 - 1

#: Largest magnitude of an SWF field: 2**53, beyond which float64 skips integers.
MAX_FIELD_VALUE: float = float(2**53)

_BLOCK_BYTES = 1 << 20
#: Capacity growth of the column arrays (so at most 25 % of them is ever unused).
_GROWTH = 1.25
_MACHINE_KEYS = ("MaxProcs", "MaxNodes")
_BOM = b"\xef\xbb\xbf"
#: Use the vectorised parser for blocks of plain numbers (tests switch it off).
_FAST_BLOCKS = True


class SWFFormatError(HpcnbError, ValueError):
    """A problem with an SWF file's content; the message starts with ``file:line``."""


#: Another name of :class:`SWFFormatError`.
SWFError = SWFFormatError


@dataclass(frozen=True)
class SWFLimits:
    """Bounds on what :func:`read_swf` reads (see the module docstring).

    Attributes:
        max_rows: Most jobs kept (each costs 152 bytes of arrays).
        max_bytes: Most bytes of text, counted after decompression.
        max_line_bytes: Longest line.
        max_header_lines: Most ``;`` comment lines.
        max_messages: Most skip messages kept in :attr:`SWFTrace.skipped`.
        max_skipped: Most lines skipped with ``on_error="skip"`` before giving up.
    """

    max_rows: int = 20_000_000
    max_bytes: int = 2 * 1024**3
    max_line_bytes: int = 65_536
    max_header_lines: int = 10_000
    max_messages: int = 1_000
    max_skipped: int = 1_000_000

    def __post_init__(self) -> None:
        for name in (
            "max_rows",
            "max_bytes",
            "max_line_bytes",
            "max_header_lines",
            "max_messages",
            "max_skipped",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(f"SWFLimits.{name}={value!r}: expected an integer >= 1")


DEFAULT_SWF_LIMITS = SWFLimits()


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
        skipped: ``"file:line: reason"`` for each malformed line skipped (at most
            :attr:`SWFLimits.max_messages`, then one line counting the rest).
        source: Where the trace was read from.
        lines: The file's line number of each job (``None`` for traces built in memory).
        skipped_count: How many lines were skipped (also those not listed).
    """

    fields: dict[str, np.ndarray]
    header: dict[str, str] = field(default_factory=dict)
    header_lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    source: str = "<memory>"
    lines: np.ndarray | None = None
    skipped_count: int = 0

    def __len__(self) -> int:
        return len(self.fields["job_id"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]

    def header_int(self, key: str) -> int | None:
        """Return an integer header value (``MaxNodes``), or ``None`` when absent or not finite."""
        value = self.header.get(key)
        if value is None:
            return None
        number = _header_number(value)
        if number is None or not math.isfinite(number):
            return None
        return int(number)

    def machine_size(self) -> int | None:
        """Return ``MaxProcs`` or else ``MaxNodes`` from the header (one processor = one node).

        Values below 1 mean unknown.

        Raises:
            SWFFormatError: The size exceeds :data:`MAX_NODES` (only possible for a
                trace built in memory: the reader refuses such headers).
        """
        for key in _MACHINE_KEYS:
            size = self.header_int(key)
            if size is not None and size >= 1:
                if size > MAX_NODES:
                    raise SWFFormatError(
                        f"{self.source}: header {key}: {size} nodes, more "
                        f"than MAX_NODES = {MAX_NODES}"
                    )
                return size
        return None

    def line_of(self, row: int) -> str:
        """Return ``"file:line"`` of job ``row`` (``"file"`` when line numbers are unknown)."""
        if self.lines is None:
            return self.source
        return f"{self.source}:{int(self.lines[row])}"

    def select(self, mask: np.ndarray) -> SWFTrace:
        """Return a trace with only the rows where ``mask`` is true (header kept)."""
        return SWFTrace(
            {k: v[mask] for k, v in self.fields.items()},
            dict(self.header),
            list(self.header_lines),
            list(self.skipped),
            self.source,
            None if self.lines is None else self.lines[mask],
            self.skipped_count,
        )

    def head(self, n: int) -> SWFTrace:
        """Return the first ``n`` jobs."""
        mask = np.zeros(len(self), dtype=bool)
        mask[:n] = True
        return self.select(mask)


def read_swf(
    path: str | Path,
    on_error: Literal["error", "skip"] = "error",
    *,
    limits: SWFLimits | None = None,
) -> SWFTrace:
    """Read an SWF (or gzip-compressed ``.swf.gz``) file, streaming it into NumPy arrays.

    Args:
        path: The file.
        on_error: ``"error"`` raises on the first malformed line; ``"skip"`` skips it
            and records ``file:line: reason`` in :attr:`SWFTrace.skipped`.
        limits: Bounds on rows, bytes, line length, header lines and messages (default
            :data:`DEFAULT_SWF_LIMITS`).

    Raises:
        MissingFileError: The file does not exist.
        SWFFormatError: A malformed line with ``on_error="error"``, a repeated job id, a
            broken ``.gz`` stream or a limit exceeded (``file:line: reason``).
        InvalidInputError: ``on_error`` is not one of the two policies.
    """
    if on_error not in ("error", "skip"):
        raise InvalidInputError(f"on_error={on_error!r}: expected 'error' or 'skip'")
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{path}: SWF file not found")
    reader = _Reader(path, on_error, limits or DEFAULT_SWF_LIMITS)
    reader.read()
    return reader.finish()


class _Reader:
    """The state of one :func:`read_swf` call: columns grown block by block."""

    def __init__(self, path: Path, on_error: str, limits: SWFLimits) -> None:
        self.path = path
        self.on_error = on_error
        self.limits = limits
        # one growing array per field (and the line numbers), resized in place (realloc,
        # so large ones are remapped, not copied); rows [0, self.rows) are filled
        self.columns = [np.empty(0, dtype=np.float64) for _ in SWF_FIELDS]
        self.line_numbers = np.empty(0, dtype=np.int64)
        self.rows = 0
        self.header: dict[str, str] = {}
        self.header_lines: list[str] = []
        self.skipped: list[str] = []
        self.skipped_count = 0

    def fail(self, lineno: int, reason: str) -> NoReturn:
        raise SWFFormatError(f"{self.path}:{lineno}: {reason}")

    def problem(self, lineno: int, reason: str) -> None:
        """Raise (``on_error="error"``) or record a skipped line."""
        if self.on_error == "error":
            self.fail(lineno, reason)
        self.skipped_count += 1
        if self.skipped_count > self.limits.max_skipped:
            self.fail(
                lineno,
                f"more than {self.limits.max_skipped} malformed lines (SWFLimits.max_skipped)",
            )
        if len(self.skipped) < self.limits.max_messages:
            self.skipped.append(f"{self.path}:{lineno}: {reason}")

    def read(self) -> None:
        """Read the file block by block (only whole lines are parsed)."""
        compressed = self.path.suffix == ".gz"
        limit = self.limits.max_bytes
        done = 0  # lines before the current block
        total = 0
        carry = b""
        broken: Exception | None = None
        with gzip.open(self.path, "rb") if compressed else self.path.open("rb") as handle:
            while broken is None:
                data, broken = _read_block(handle)
                if not data:
                    break
                if total == 0 and data.startswith(_BOM):
                    data = data[len(_BOM) :]
                total += len(data)
                if total > limit:
                    within = data[: len(data) - (total - limit)]
                    where = done + (carry + within).count(b"\n") + 1
                    after = " after decompression" if compressed else ""
                    self.fail(
                        where, f"more than {limit} bytes of text{after} (SWFLimits.max_bytes)"
                    )
                buf = carry + data if carry else data
                cut = buf.rfind(b"\n") + 1
                block, carry = buf[:cut], buf[cut:]
                if len(carry) > self.limits.max_line_bytes:
                    self._too_long(done + block.count(b"\n") + 1, len(carry))
                if block:
                    self._block(block, done)
                    done += block.count(b"\n")
        if broken is not None:  # the lines before the break were read (and checked)
            where = done + 1
            if isinstance(broken, EOFError):
                self.fail(where, "the compressed stream ends early (truncated .gz file)")
            if isinstance(broken, gzip.BadGzipFile):
                self.fail(where, f"not a valid gzip file ({broken})")
            self.fail(where, f"corrupt compressed data ({broken})")
        if carry:
            self._block(carry + b"\n", done)

    def _too_long(self, lineno: int, size: int) -> NoReturn:
        self.fail(
            lineno,
            f"line longer than {self.limits.max_line_bytes} bytes "
            f"({size} read; SWFLimits.max_line_bytes)",
        )

    def _block(self, block: bytes, before: int) -> None:
        """Parse a block of whole lines; ``before`` lines precede it in the file."""
        if not block.strip():  # blank lines only (a gzip bomb of line breaks, say)
            return
        if not _FAST_BLOCKS:
            self._add(*self._parse_lines(block, before))
            return
        plain = _PLAIN_BYTES[np.frombuffer(block, dtype=np.uint8)]
        if not plain.all():  # parse up to the last line with other bytes (a header) exactly
            cut = block.find(b"\n", int(np.flatnonzero(~plain)[-1])) + 1
            head, block = block[:cut], block[cut:]
            self._add(*self._parse_lines(head, before))
            before += head.count(b"\n")
        parsed = _parse_plain_block(block) if block else None
        if parsed is None:
            values, lines = self._parse_lines(block, before)
        else:
            values, lines = self._check_values(parsed[0], parsed[1] + (before + 1))
        self._add(values, lines)

    def _parse_lines(self, block: bytes, before: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact, line-by-line parser (Python's ``str.split`` and ``float``)."""
        rows: list[list[float]] = []
        lines: list[int] = []
        for i, raw in enumerate(block.split(b"\n")[:-1]):
            lineno = before + i + 1
            if len(raw) > self.limits.max_line_bytes:
                self._too_long(lineno, len(raw))
            undecodable: UnicodeDecodeError | None = None
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                text = raw.decode("utf-8", errors="replace")
                undecodable = exc
            line = text.strip()
            if not line:
                continue
            if line.startswith(";"):
                self._comment(line, lineno)
                continue
            if undecodable is not None:
                column = undecodable.start + 1
                self.problem(
                    lineno,
                    f"byte {raw[undecodable.start]:#04x} at column {column} is not UTF-8 text",
                )
                continue
            parts = line.split()
            if len(parts) != len(SWF_FIELDS):
                self.problem(lineno, f"expected 18 fields, found {len(parts)}")
                continue
            try:
                row = [float(p) for p in parts]
            except ValueError:
                k = next(j for j, p in enumerate(parts) if not _is_number(p))
                self.problem(
                    lineno,
                    f"field {k + 1} ({SWF_FIELDS[k]}) is {_show(parts[k])}, expected a number",
                )
                continue
            bad = next((j for j, v in enumerate(row) if not abs(v) <= MAX_FIELD_VALUE), None)
            if bad is not None:
                self.problem(lineno, _value_reason(bad, row[bad]))
                continue
            rows.append(row)
            lines.append(lineno)
        values = np.array(rows, dtype=np.float64).reshape(-1, len(SWF_FIELDS))
        return values, np.array(lines, dtype=np.int64)

    def _check_values(self, values: np.ndarray, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Refuse (or drop) rows with a non-finite or too large value, in line order."""
        bad = ~(np.abs(values) <= MAX_FIELD_VALUE)
        if not bad.any():
            return values, lines
        keep = np.ones(len(values), dtype=bool)
        for r in np.flatnonzero(bad.any(axis=1)):
            k = int(np.argmax(bad[r]))
            self.problem(int(lines[r]), _value_reason(k, float(values[r, k])))
            keep[r] = False
        return values[keep], lines[keep]

    def _comment(self, line: str, lineno: int) -> None:
        text = line[1:].strip()
        if len(self.header_lines) >= self.limits.max_header_lines:
            self.fail(
                lineno,
                f"more than {self.limits.max_header_lines} header comment "
                "lines (SWFLimits.max_header_lines)",
            )
        key, sep, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if sep and key and " " not in key:
            if key in _MACHINE_KEYS:
                number = _header_number(value)
                if number is not None and not (math.isfinite(number) and number <= MAX_NODES):
                    self.problem(
                        lineno,
                        f"header {key}: {_show(value)} is not a machine size "
                        f"(at most MAX_NODES = {MAX_NODES} nodes)",
                    )
                    return
            self.header[key] = value
        self.header_lines.append(text)

    def _add(self, values: np.ndarray, lines: np.ndarray) -> None:
        count = len(values)
        if count == 0:
            return
        room = self.limits.max_rows - self.rows
        if count > room:
            self.fail(
                int(lines[room]), f"more than {self.limits.max_rows} jobs (SWFLimits.max_rows)"
            )
        if self.on_error == "error":  # a repeat within the block fails now, not at the end
            self._repeated_ids(values[:, 0], lines)
        end = self.rows + count
        if end > len(self.line_numbers):
            capacity = max(end, int(len(self.line_numbers) * _GROWTH), 4096)
            capacity = min(capacity, max(end, self.limits.max_rows))
            for array in (*self.columns, self.line_numbers):
                array.resize(capacity, refcheck=False)
        for k, column in enumerate(self.columns):
            column[self.rows : end] = values[:, k]
        self.line_numbers[self.rows : end] = lines
        self.rows = end

    def finish(self) -> SWFTrace:
        """Trim the arrays to the rows read (in place); check ids."""
        for array in (*self.columns, self.line_numbers):
            array.resize(self.rows, refcheck=False)
        fields = dict(zip(SWF_FIELDS, self.columns, strict=True))
        lines = self.line_numbers
        keep = self._repeated_ids(fields["job_id"], lines)
        if keep is not None:
            fields = {name: column[keep] for name, column in fields.items()}
            lines = lines[keep]
        listed = len(self.skipped)
        if self.skipped_count > listed:
            self.skipped.append(
                f"{self.path}: {self.skipped_count - listed} more lines "
                f"skipped (the first {listed} are listed)"
            )
        return SWFTrace(
            fields,
            self.header,
            self.header_lines,
            self.skipped,
            str(self.path),
            lines,
            self.skipped_count,
        )

    def _repeated_ids(self, ids: np.ndarray, lines: np.ndarray) -> np.ndarray | None:
        """Report each job id used on an earlier line; return the rows to keep (or None)."""
        if ids.size < 2:
            return None
        key = np.trunc(ids)
        if np.all(key[1:] > key[:-1]):  # the usual case: increasing ids
            return None
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        same = ordered[1:] == ordered[:-1]
        if not same.any():
            return None
        new_group = np.concatenate(([True], ~same))
        group_start = np.flatnonzero(new_group)
        group_of = np.cumsum(new_group) - 1
        repeat_pos = np.flatnonzero(same) + 1
        repeats = order[repeat_pos]
        firsts = order[group_start[group_of[repeat_pos]]]
        in_file_order = np.argsort(repeats, kind="stable")
        shown = in_file_order[: self.limits.max_messages + 1]
        for r, f in zip(repeats[shown], firsts[shown], strict=True):
            self.problem(
                int(lines[r]), f"job id {int(key[r])} repeats the job id of line {int(lines[f])}"
            )
        self.skipped_count += len(repeats) - len(shown)
        keep = np.ones(ids.size, dtype=bool)
        keep[repeats] = False
        return keep


_PLAIN_BYTES = np.zeros(256, dtype=bool)
_PLAIN_BYTES[np.frombuffer(b"0123456789+-.eE \t\r\n", dtype=np.uint8)] = True
_BLANK_BYTES = np.zeros(256, dtype=bool)
_BLANK_BYTES[np.frombuffer(b" \t\r\n", dtype=np.uint8)] = True


def _read_block(handle: io.BufferedIOBase) -> tuple[bytes, Exception | None]:
    """Read about ``_BLOCK_BYTES``; on a broken stream, return what came before the break.

    ``read1`` returns the decompressed data piece by piece, so the bytes before a
    truncation or corruption are not lost with the exception.
    """
    parts: list[bytes] = []
    size = 0
    try:
        while size < _BLOCK_BYTES:
            piece = handle.read1(_BLOCK_BYTES - size)
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        return b"".join(parts), exc
    return b"".join(parts), None


def _parse_plain_block(block: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """Parse a block of whole lines of plain numbers with pandas' C parser.

    Returns:
        The values (rows x 18) and each row's 0-based line index in the block, or
        ``None`` when the block holds anything else (comments, other characters, a line
        without 18 fields, a token that is not a number): the exact parser handles it.
    """
    b = np.frombuffer(block, dtype=np.uint8)
    if not _PLAIN_BYTES[b].all():
        return None
    returns = np.flatnonzero(b == 13)
    if returns.size and (returns[-1] + 1 >= b.size or np.any(b[returns + 1] != 10)):
        return None  # a lone \r would be a line break to pandas but not to us
    blank = _BLANK_BYTES[b]
    token_start = ~blank
    token_start[1:] &= blank[:-1]
    starts = np.flatnonzero(token_start)
    newlines = np.flatnonzero(b == 10)
    per_line = np.diff(np.searchsorted(starts, newlines), prepend=0)
    if np.any((per_line != 0) & (per_line != len(SWF_FIELDS))):
        return None
    data_lines = np.flatnonzero(per_line)
    if data_lines.size == 0:
        return np.empty((0, len(SWF_FIELDS))), data_lines
    import pandas as pd  # imported on the first plain block, not for a quick error

    try:
        frame = pd.read_csv(
            io.BytesIO(block),
            sep=r"\s+",
            header=None,
            names=range(len(SWF_FIELDS)),
            index_col=False,
            dtype=np.float64,
            na_filter=False,
            engine="c",
        )
    except ValueError:  # pandas' ParserError is a ValueError
        return None
    values = frame.to_numpy(dtype=np.float64)
    if values.shape != (data_lines.size, len(SWF_FIELDS)):
        return None
    return values, data_lines


def _header_number(value: str) -> float | None:
    try:
        return float(value.split()[0])
    except (ValueError, IndexError):
        return None


def _value_reason(k: int, value: float) -> str:
    name = f"field {k + 1} ({SWF_FIELDS[k]})"
    if not math.isfinite(value):
        return f"{name} is {value}, expected a finite number"
    return f"{name} is {value:g}, beyond ±2**53 (MAX_FIELD_VALUE)"


def _show(text: str, width: int = 40) -> str:
    """``repr`` of ``text``, cut to ``width`` characters so messages stay one short line."""
    return repr(text) if len(text) <= width else repr(text[:width]) + "..."


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

    Args:
        trace: The trace (its header lines, else its header fields, then its jobs).
        path: The file to write; a name ending in ``.gz`` is gzip-compressed.

    Returns:
        The path written.
    """
    path = Path(path)
    lines = [f"; {text}" if text else ";" for text in trace.header_lines]
    if not trace.header_lines:
        lines = [f"; {k}: {v}" for k, v in trace.header.items()]
    # one % template per block of rows: whole-valued columns as integers, others by _format
    formats: list[str] = []
    columns: list[np.ndarray[Any, Any]] = []
    for name in SWF_FIELDS:
        col = np.asarray(trace.fields[name], dtype=np.float64)
        if np.all(np.isfinite(col) & (col == np.trunc(col))):
            formats.append("%d")
            columns.append(col.astype(np.int64))
        else:
            formats.append("%s")
            columns.append(np.array([_format(float(v)) for v in col], dtype=object))
    row = " ".join(formats) + "\n"
    n, step = len(trace), 1 << 16
    text = "\n".join(lines) + "\n" if lines or not n else ""
    blocks = [text]
    for lo in range(0, n, step):
        m = min(n, lo + step) - lo
        block = np.empty((m, len(columns)), dtype=object)
        for k, col in enumerate(columns):
            block[:, k] = col[lo : lo + m].tolist()
        blocks.append((row * m) % tuple(block.ravel().tolist()))
    text = "".join(blocks)
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
