"""Regression tests of issue 18 for SWF traces and ``hpcnb batchsim simulate``.

Each hostile or oversized input of the issue gives :class:`SWFFormatError` with
``file:line`` from the reader, and exit status 2 with one line on stderr from the
command, quickly and in little memory; a 100 MB (unpacked) ``.swf.gz`` streams into
NumPy within a bounded peak.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from hpcnb.batchsim import swf
from hpcnb.batchsim.cli import register
from hpcnb.batchsim.rigid import simulate_rigid_arrays
from hpcnb.batchsim.swf import (
    MAX_NODES,
    SWFError,
    SWFFormatError,
    SWFLimits,
    read_swf,
    trace_from_arrays,
)
from hpcnb.batchsim.workloads import jobs_from_swf
from hpcnb.errors import HpcnbError

HEADER = "; Version: 2.2\n; MaxNodes: 16\n"


def job(jid: object, size: object = 2, run: object = 10, submit: object = 0) -> str:
    """One SWF line with the fields the simulator uses."""
    return f"{jid} {submit} 0 {run} {size} -1 -1 {size} 60 -1 1 4 1 -1 1 1 -1 -1\n"


GOOD = HEADER + job(1) + job(2, 4, 20, 5) + job(3, 1, 5, 7)
MANY = HEADER + "".join(job(i) for i in range(1, 3001))


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return path


def test_error_type_is_a_project_error_and_keeps_its_old_name():
    assert SWFError is SWFFormatError
    assert issubclass(SWFFormatError, HpcnbError) and issubclass(SWFFormatError, ValueError)


def test_truncated_gzip(tmp_path):
    path = write(tmp_path, "t.swf.gz", MANY)
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(SWFFormatError, match=r"t\.swf\.gz:\d+: .*truncated") as error:
        read_swf(path)
    line = int(str(error.value).split(":")[1])
    assert 2000 < line <= 3003  # where the stream broke, after the lines before it


def test_repeated_line_bomb_fails_at_the_first_block(tmp_path):
    path = tmp_path / "same.swf.gz"
    with gzip.open(path, "wb", compresslevel=9) as handle:
        handle.write(HEADER.encode())
        for _ in range(20):
            handle.write(job(1).encode() * 100_000)  # 90 MB of one line in about 100 KB
    tracemalloc.start()
    with pytest.raises(SWFFormatError, match=r"same\.swf\.gz:4: job id 1 repeats .* line 3"):
        read_swf(path)
    assert tracemalloc.get_traced_memory()[1] < 64 * 2**20
    tracemalloc.stop()


def test_not_gzip(tmp_path):
    path = tmp_path / "plain.swf.gz"
    path.write_text(GOOD)
    with pytest.raises(SWFFormatError, match=r"plain\.swf\.gz:1: not a valid gzip file"):
        read_swf(path)


def test_corrupt_gzip_data(tmp_path):
    packed = bytearray(gzip.compress((GOOD * 50).encode(), mtime=0))
    packed[len(packed) // 2] ^= 0xFF
    path = tmp_path / "c.swf.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(SWFFormatError, match=r"c\.swf\.gz:\d+: "):
        read_swf(path)


def test_undecodable_bytes(tmp_path):
    path = write(
        tmp_path, "u.swf", HEADER.encode() + b"; caf\xe9\n" + b"1 \xff" + b" 0" * 17 + b"\n"
    )
    with pytest.raises(SWFFormatError, match=r"u\.swf:4: byte 0xff at column 3 is not UTF-8"):
        read_swf(path)
    trace = read_swf(path, on_error="skip")  # the comment's byte is replaced, kept
    assert len(trace) == 0 and trace.header_lines[-1] == "caf\ufffd"


def test_duplicate_job_ids_name_both_lines(tmp_path):
    path = write(tmp_path, "d.swf", GOOD + job(2, 1, 3, 9))
    with pytest.raises(SWFFormatError, match=r"d\.swf:6: job id 2 repeats the job id of line 4"):
        read_swf(path)
    trace = read_swf(path, on_error="skip")
    assert list(trace["job_id"]) == [1, 2, 3] and trace.skipped_count == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (job("nan"), r"n\.swf:6: field 1 \(job_id\) is nan, expected a finite number"),
        (job(9, run="inf"), r"n\.swf:6: field 4 \(run_time\) is inf"),
        (job(9, size="1e30"), r"n\.swf:6: field 5 \(allocated_processors\) is 1e\+30, beyond"),
        (job(9, submit="9" * 25), r"n\.swf:6: field 2 \(submit_time\) is 1e\+25, beyond"),
    ],
)
def test_non_finite_and_absurd_fields(tmp_path, line, message):
    path = write(tmp_path, "n.swf", GOOD + line)
    with pytest.raises(SWFFormatError, match=message):
        read_swf(path)
    with pytest.MonkeyPatch.context() as patch:  # the exact parser says the same
        patch.setattr(swf, "_FAST_BLOCKS", False)
        with pytest.raises(SWFFormatError, match=message):
            read_swf(path)


@pytest.mark.parametrize("value", ["1e30", "inf", "nan", "99999999999999999999999"])
def test_absurd_machine_size_header(tmp_path, value):
    path = write(tmp_path, "h.swf", f"; MaxNodes: {value}\n" + job(1))
    with pytest.raises(SWFFormatError, match=rf"h\.swf:1: header MaxNodes: .* {MAX_NODES}"):
        read_swf(path)


def test_machine_size_of_traces_built_in_memory():
    trace = trace_from_arrays(np.zeros(1), np.ones(1), np.ones(1), header={"MaxProcs": "inf"})
    assert trace.header_int("MaxProcs") is None and trace.machine_size() is None
    trace = trace_from_arrays(np.zeros(1), np.ones(1), np.ones(1), header={"MaxNodes": "1e30"})
    with pytest.raises(SWFFormatError, match="MAX_NODES"):
        trace.machine_size()
    trace = trace_from_arrays(
        np.zeros(1), np.ones(1), np.ones(1), header={"MaxProcs": "-1", "MaxNodes": "8"}
    )
    assert trace.machine_size() == 8  # -1 is unknown: fall back to MaxNodes


def test_node_counts_are_bounded_before_numba():
    trace = trace_from_arrays(np.zeros(2), np.ones(2), np.array([1, 2]))
    for nodes in (0, -3, 10**23, MAX_NODES + 1):
        with pytest.raises(ValueError, match="num_nodes"):
            jobs_from_swf(trace, nodes)
    one = np.ones(1)
    with pytest.raises(ValueError, match="total_nodes"):
        simulate_rigid_arrays(np.zeros(1), one, one, one, 10**23, "easy")
    with pytest.raises(ValueError, match="finite"):
        simulate_rigid_arrays(np.zeros(1), np.array([np.inf]), one, one, 4, "easy")
    assert jobs_from_swf(trace, MAX_NODES).num_nodes == MAX_NODES


def test_jobs_larger_than_the_machine_skip_or_strict(tmp_path):
    path = write(tmp_path, "big.swf", GOOD + job(4, 64, 5, 9))
    trace = read_swf(path)
    loaded = jobs_from_swf(trace)
    assert [j.id for j in loaded.jobs] == [1, 2, 3]
    assert loaded.skipped == ["job 4: 64 nodes > machine of 16"]
    with pytest.raises(
        SWFFormatError, match=r"big\.swf:6: job 4 needs 64 nodes, the machine has 16"
    ):
        jobs_from_swf(trace, strict=True)


def test_row_limit(tmp_path):
    path = write(tmp_path, "r.swf", GOOD)
    with pytest.raises(SWFFormatError, match=r"r\.swf:5: more than 2 jobs \(SWFLimits.max_rows\)"):
        read_swf(path, limits=SWFLimits(max_rows=2))
    assert len(read_swf(path, limits=SWFLimits(max_rows=3))) == 3


def test_gzip_bomb_stops_at_the_byte_limit(tmp_path):
    path = tmp_path / "bomb.swf.gz"
    with gzip.open(path, "wb", compresslevel=9) as handle:
        for _ in range(64):
            handle.write(b"\n" * 2**20)  # 64 MiB of empty lines in about 64 KB
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(
        SWFFormatError, match=r"more than 4194304 bytes of text after decompression"
    ):
        read_swf(path, limits=SWFLimits(max_bytes=4 * 2**20))
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20 and seconds < 30  # generous: only a runaway fails


def test_line_and_header_limits(tmp_path):
    path = write(tmp_path, "long.swf", GOOD + "1" * 100_000)
    with pytest.raises(SWFFormatError, match=r"long\.swf:6: line longer than 65536 bytes"):
        read_swf(path)
    path = write(tmp_path, "long2.swf", GOOD + "1 " * 50_000 + "\n" + job(7))
    with pytest.raises(SWFFormatError, match=r"long2\.swf:6: line longer than 65536 bytes"):
        read_swf(path)
    path = write(tmp_path, "hdr.swf", ";\n" * 20 + job(1))
    with pytest.raises(SWFFormatError, match=r"hdr\.swf:11: more than 10 header comment lines"):
        read_swf(path, limits=SWFLimits(max_header_lines=10))
    with pytest.raises(ValueError, match="max_rows"):
        SWFLimits(max_rows=0)


def test_skip_messages_are_capped_but_counted(tmp_path):
    path = write(tmp_path, "s.swf", GOOD + "oops\n" * 50)
    trace = read_swf(path, on_error="skip", limits=SWFLimits(max_messages=5))
    assert len(trace) == 3 and trace.skipped_count == 50
    assert len(trace.skipped) == 6
    assert trace.skipped[-1].endswith("45 more lines skipped (the first 5 are listed)")
    with pytest.raises(SWFFormatError, match=r"s\.swf:16: more than 10 malformed lines"):
        read_swf(path, on_error="skip", limits=SWFLimits(max_skipped=10))


def test_byte_order_mark_and_crlf(tmp_path):
    path = write(tmp_path, "bom.swf", b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode())
    trace = read_swf(path)
    assert len(trace) == 3 and trace.header["MaxNodes"] == "16"
    assert list(trace.lines) == [3, 4, 5]


def test_real_traces_read_the_same_by_both_parsers(shared_data):
    for name in ("hpc2n-seth-first3170.swf", "lublin-256-synthetic.swf"):
        fast = read_swf(shared_data / "swf" / name)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(swf, "_FAST_BLOCKS", False)
            exact = read_swf(shared_data / "swf" / name)
        for field in swf.SWF_FIELDS:
            assert fast[field].tobytes() == exact[field].tobytes()
        assert fast.header == exact.header and fast.header_lines == exact.header_lines


def write_big_trace(path: Path, megabytes: int) -> int:
    """Write a ``.swf.gz`` of about ``megabytes`` MB of text with unique ids; return rows."""
    rng = np.random.default_rng(0)
    tails = [
        " ".join(
            str(v)
            for v in [
                int(rng.integers(0, 10**6)),
                int(rng.integers(0, 9999)),
                int(rng.integers(1, 86400)),
                int(rng.integers(1, 256)),
                -1,
                -1,
                int(rng.integers(1, 256)),
                86400,
                -1,
                1,
                int(rng.integers(1, 500)),
                1,
                -1,
                1,
                1,
                -1,
                -1,
            ]
        )
        for _ in range(997)
    ]
    rows = 0
    size = 0
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(b"; Version: 2.2\n; MaxNodes: 256\n")
        while size < megabytes * 10**6:
            text = "".join(f"{rows + i + 1} {tails[(rows + i) % 997]}\n" for i in range(50_000))
            handle.write(text.encode())
            rows += 50_000
            size += len(text)
    return rows


def test_100_mb_unpacked_trace_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "big.swf.gz"
    rows = write_big_trace(path, 100)
    tracemalloc.start()
    trace = read_swf(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    arrays = sum(column.nbytes for column in trace.fields.values()) + trace.lines.nbytes
    assert len(trace) == rows and trace["job_id"][-1] == rows
    assert peak < 1.5 * arrays + 64 * 2**20, (peak, arrays)  # about the arrays, not 20x the text
    assert peak < 600 * 2**20


# -- the command line -------------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hpcnb")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def simulate_cli(path: Path, out: Path, *extra: str) -> int:
    return run_cli(
        ["batchsim", "simulate", str(path), "--scheduler", "easy", "--out", str(out), *extra]
    )


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("hpcnb batchsim simulate: ")
    return err


def hostile_inputs(folder: Path) -> dict[str, tuple[Path, str]]:
    """The issue's SWF inputs: name -> (file, the file:line the error must name)."""
    truncated = write(folder, "trunc.swf.gz", MANY)
    truncated.write_bytes(truncated.read_bytes()[:-40])
    not_gz = folder / "notgz.swf.gz"
    not_gz.write_text(GOOD)
    return {
        "truncated": (truncated, "trunc.swf.gz:"),
        "not gzip": (not_gz, "notgz.swf.gz:1:"),
        "duplicate": (write(folder, "dup.swf", GOOD + job(1)), "dup.swf:6:"),
        "nan id": (write(folder, "nan.swf", GOOD + job("nan")), "nan.swf:6:"),
        "huge header": (write(folder, "hh.swf", "; MaxNodes: 1e30\n" + job(1)), "hh.swf:1:"),
        "undecodable": (write(folder, "bytes.swf", GOOD.encode() + b"\xfe\xff\n"), "bytes.swf:6:"),
    }


def test_cli_hostile_swf_inputs_exit_2_with_one_line(tmp_path, capsys):
    for name, (path, place) in hostile_inputs(tmp_path).items():
        start = time.perf_counter()
        assert simulate_cli(path, tmp_path / "out") == 2, name
        assert time.perf_counter() - start < 30  # generous: the issue asks for 2 s
        assert place in one_error_line(capsys), name


def test_cli_nodes_bounds(tmp_path, capsys):
    path = write(tmp_path, "ok.swf", GOOD)
    for value, message in (
        ("0", "--nodes must be >= 1"),
        ("-5", "--nodes must be >= 1"),
        ("99999999999999999999999", f"--nodes must be <= {MAX_NODES}"),
        ("many", "expected an integer"),
    ):
        with pytest.raises(SystemExit) as stop:
            simulate_cli(path, tmp_path / "out", "--nodes", value)
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert run_cli(["batchsim", "generate", str(tmp_path / "g.swf"), "--nodes", "0"]) == 2


def test_cli_strict_for_swf(tmp_path, capsys):
    path = write(tmp_path, "big.swf", GOOD + job(4, 64, 5, 9))
    assert simulate_cli(path, tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert "skipped job 4: 64 nodes > machine of 16" in err
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["skipped"] == 1
    assert simulate_cli(path, tmp_path / "out", "--strict") == 2
    assert "big.swf:6: job 4 needs 64 nodes" in one_error_line(capsys)


def test_cli_skip_count_counts_unlisted_lines(tmp_path, capsys):
    path = write(tmp_path, "many.swf", GOOD + "oops\n" * 1500)
    assert simulate_cli(path, tmp_path / "out", "--on-error", "skip") == 0
    assert "1500 line(s)/job(s) skipped" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["skipped"] == 1500


def test_cli_elastisim_example_on_a_smaller_machine(shared_data, tmp_path, capsys):
    example = tmp_path / "example"
    shutil.copytree(shared_data / "elastisim-example", example)
    jobs = example / "jobs.json"
    assert simulate_cli(jobs, tmp_path / "out", "--nodes", "8") == 0
    err = capsys.readouterr().err
    assert "nodes > machine of 8" in err and "skipped job" in err
    assert simulate_cli(jobs, tmp_path / "out", "--nodes", "8", "--strict") == 2
    assert "jobs.json" in one_error_line(capsys)


def test_cli_missing_file_is_one_line(tmp_path, capsys):
    assert simulate_cli(tmp_path / "nope.swf", tmp_path / "out") == 2
    assert "nope.swf" in one_error_line(capsys)
