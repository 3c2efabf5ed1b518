"""Fuzz tests of the SWF reader (issue 18): generated inputs, one documented error type.

Whatever the bytes, :func:`read_swf` returns a consistent trace or raises
:class:`SWFFormatError` naming the file (and line), within a time bound (Hypothesis'
deadline) and a memory bound (``tracemalloc`` peak per input). The vectorised parser of
plain-number blocks must agree with the exact line-by-line parser bit for bit, message
for message, whatever the block size. Derandomized, so a run is reproducible.
"""

from __future__ import annotations

import gzip
import tracemalloc
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcnb.batchsim import swf
from hpcnb.batchsim.platform import Platform
from hpcnb.batchsim.scheduler import EasyBackfilling
from hpcnb.batchsim.simulation import simulate
from hpcnb.batchsim.swf import (
    MAX_FIELD_VALUE,
    SWF_FIELDS,
    SWFFormatError,
    SWFTrace,
    read_swf,
)
from hpcnb.batchsim.workloads import jobs_from_swf

#: Peak traced memory allowed for reading one input of at most a few kilobytes.
MEMORY_BOUND = 32 * 2**20

# The deadline bounds runaway work (a quadratic or unbounded parse of a few kilobytes), not
# speed: inputs take milliseconds, but under tracemalloc on a loaded 2-core machine one took
# 9.8 s in a CI rehearsal, so the bound is generous.
FUZZ = settings(
    max_examples=120,
    deadline=timedelta(seconds=60),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the generated files (module-scoped: Hypothesis reruns the test body)."""
    return tmp_path_factory.mktemp("fuzz_swf")


def bounded_read(path: Path, **kwargs: object) -> SWFTrace | SWFFormatError:
    """Read ``path``; return the trace or the SWFFormatError; check the memory bound."""
    tracemalloc.start()
    try:
        return read_swf(path, **kwargs)  # type: ignore[arg-type]
    except SWFFormatError as exc:
        assert str(exc).startswith(f"{path}:"), str(exc)
        assert "\n" not in str(exc)
        return exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"{peak / 2**20:.1f} MiB traced for one small input"


def check_trace(trace: SWFTrace) -> None:
    """What every trace the reader returns satisfies."""
    n = len(trace)
    assert set(trace.fields) == set(SWF_FIELDS)
    for column in trace.fields.values():
        assert column.dtype == np.float64 and column.shape == (n,)
        assert np.all(np.abs(column) <= MAX_FIELD_VALUE)
    assert trace.lines is not None and trace.lines.shape == (n,)
    assert np.all(np.diff(trace.lines) > 0)
    ids = np.trunc(trace["job_id"])
    assert len(np.unique(ids)) == n, "job ids repeat"
    assert trace.skipped_count >= 0


# -- generated text ----------------------------------------------------------------------

special = st.sampled_from(
    [
        "nan",
        "NaN",
        "-nan",
        "inf",
        "-inf",
        "Infinity",
        "1e30",
        "-1e30",
        "1e999",
        "9" * 25,
        "99999999999999999999999",
        "0x10",
        "1_000",
        "--1",
        ".",
        "-",
        "1e",
        "e5",
        "+.5",
        "-0",
        "4294967295",
        "9007199254740993",
        "٣",
        "\x00",
        "\ufeff",
        "1,5",
    ]
)
number = st.one_of(
    st.integers(-2, 10**6).map(str),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-1e6, 1e6).map(lambda x: f"{x:.2f}"),
    special,
)
separator = st.sampled_from([" ", "  ", "\t", " \t "])


@st.composite
def data_line(draw: st.DrawFn) -> str:
    count = draw(st.sampled_from([18] * 8 + [0, 1, 17, 19]))
    tokens = draw(st.lists(number, min_size=count, max_size=count))
    return draw(separator).join(tokens)


header_line = st.one_of(
    st.sampled_from(["MaxNodes", "MaxProcs", "Version", "Queue", "Note"]).flatmap(
        lambda key: st.one_of(number, st.text(max_size=12)).map(lambda v: f"; {key}: {v}")
    ),
    st.text(max_size=30).map(lambda t: ";" + t),
)
junk_line = st.text(max_size=40)
any_line = st.one_of(data_line(), data_line(), data_line(), header_line, junk_line, st.just(""))


@st.composite
def swf_bytes(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(any_line, max_size=15))
    if draw(st.booleans()):  # repeat a job id now and then
        lines.append(lines[-1] if lines else "")
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    data = ending.join(lines).encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 4)) == 0:  # stray bytes that are not UTF-8
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(min_size=1, max_size=4)) + data[cut:]
    if draw(st.booleans()):
        data += ending.encode()
    return data


@FUZZ
@given(data=swf_bytes(), on_error=st.sampled_from(["error", "skip"]))
def test_reader_on_generated_text(folder: Path, data: bytes, on_error: str) -> None:
    path = folder / "text.swf"
    path.write_bytes(data)
    result = bounded_read(path, on_error=on_error)
    if isinstance(result, SWFTrace):
        check_trace(result)
        # whatever was read becomes jobs and simulates without a crash
        loaded = jobs_from_swf(result, num_nodes=8)
        simulate(loaded.jobs, Platform(8), EasyBackfilling())


@settings(FUZZ, max_examples=60)
@given(data=swf_bytes())
def test_reader_on_gzip_of_generated_text(folder: Path, data: bytes) -> None:
    path = folder / "text.swf.gz"
    path.write_bytes(gzip.compress(data, mtime=0))
    plain = folder / "same.swf"
    plain.write_bytes(data)
    packed, unpacked = bounded_read(path), bounded_read(plain)
    if isinstance(unpacked, SWFTrace):
        assert isinstance(packed, SWFTrace)
        for name in SWF_FIELDS:
            assert packed[name].tobytes() == unpacked[name].tobytes()
    else:
        assert str(packed).replace(str(path), "") == str(unpacked).replace(str(plain), "")


@settings(FUZZ, max_examples=80)
@given(data=st.binary(max_size=600))
def test_reader_on_random_bytes_named_gz(folder: Path, data: bytes) -> None:
    path = folder / "random.swf.gz"
    path.write_bytes(data)
    result = bounded_read(path)
    if isinstance(result, SWFTrace):
        check_trace(result)


@settings(FUZZ, max_examples=80)
@given(data=swf_bytes(), cut=st.floats(0.0, 1.0), flip=st.integers(0, 2**16))
def test_reader_on_truncated_and_corrupted_gzip(
    folder: Path, data: bytes, cut: float, flip: int
) -> None:
    packed = gzip.compress(data or b"1" * 18, mtime=0)
    path = folder / "broken.swf.gz"
    path.write_bytes(packed[: int(cut * (len(packed) - 1))])
    result = bounded_read(path)
    plain = folder / "whole.swf"
    plain.write_bytes(data or b"1" * 18)
    if isinstance(result, SWFTrace):
        check_trace(result)
    elif isinstance(bounded_read(plain), SWFTrace):  # good lines: the break is the error
        assert any(word in str(result) for word in ("truncated", "gzip", "compressed"))
    corrupted = bytearray(packed)
    corrupted[flip % len(packed)] ^= 1 + flip % 255
    path.write_bytes(bytes(corrupted))
    result = bounded_read(path)
    if isinstance(result, SWFTrace):
        check_trace(result)


# -- the vectorised parser agrees with the exact one -------------------------------------

plain_token = st.one_of(
    st.integers(-2, 10**5).map(str),
    st.integers(-(10**20), 10**20).map(str),
    st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 10**8)).map(lambda t: f"{t[0]}.{t[1]}"),
    st.tuples(st.integers(-999, 999), st.sampled_from("eE"), st.integers(-400, 400)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]:+d}" if t[2] % 2 else f"{t[0]}{t[1]}{t[2]}"
    ),
    st.text(alphabet="0123456789+-.eE", min_size=1, max_size=6),
    st.sampled_from(["-1", "0", "-0", ".5", "-.5", "5.", "9007199254740992", "9007199254740993"]),
)


@st.composite
def plain_text(draw: st.DrawFn) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        count = draw(st.sampled_from([18] * 10 + [0, 17, 19]))
        tokens = draw(st.lists(plain_token, min_size=count, max_size=count))
        lead = draw(st.sampled_from(["", " ", "\t"]))
        lines.append(lead + draw(separator).join(tokens) + draw(st.sampled_from(["", " "])))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), "; MaxNodes: 64")
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return (ending.join(lines) + draw(st.sampled_from(["", ending]))).encode()


def outcome(path: Path, on_error: str) -> tuple[object, ...]:
    try:
        trace = read_swf(path, on_error=on_error)  # type: ignore[arg-type]
    except SWFFormatError as exc:
        return ("error", str(exc))
    columns = tuple(trace[name].tobytes() for name in SWF_FIELDS)
    return ("ok", columns, trace.lines.tobytes(), tuple(trace.skipped), trace.header)  # type: ignore[union-attr]


@settings(FUZZ, max_examples=100)
@given(data=plain_text(), on_error=st.sampled_from(["error", "skip"]))
def test_fast_and_exact_parsers_agree(folder: Path, data: bytes, on_error: str) -> None:
    path = folder / "plain.swf"
    path.write_bytes(data)
    fast = outcome(path, on_error)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(swf, "_FAST_BLOCKS", False)
        assert outcome(path, on_error) == fast
    with pytest.MonkeyPatch.context() as patch:  # lines cut across tiny blocks
        patch.setattr(swf, "_BLOCK_BYTES", 97)
        assert outcome(path, on_error) == fast


def test_fast_parser_is_used_on_plain_blocks() -> None:
    line = b"1 0 0 10 2 -1 -1 2 60 -1 1 4 1 -1 1 1 -1 -1\n"
    parsed = swf._parse_plain_block(line * 3)
    assert parsed is not None and parsed[0].shape == (3, 18)
    assert swf._parse_plain_block(b"; header\n" + line) is None
    assert swf._parse_plain_block(b"1 2\r3\n") is None  # a lone CR
