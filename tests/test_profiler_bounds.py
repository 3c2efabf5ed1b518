"""Tests of the resource bounds of the valgrind profiler and of the scaling-table reader.

Tracing: a lackey log is stopped while it grows past its limit, the program's output is
kept as a bounded tail, and a damaged cached allocation logger is rebuilt. Tables: an
over-long field, binary data and an oversized file end with one line naming file and line.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import psutil
import pytest

import hpcnb.launch
from hpcnb.cli import main
from hpcnb.commprof.valgrind import (
    OUTPUT_TAIL_BYTES,
    TraceError,
    allocation_logger,
    missing_tools,
    parse_trace,
    run_program,
)
from hpcnb.launch import ProcessTree, run_bounded
from hpcnb.perfmodel import scaling
from hpcnb.perfmodel.scaling import ScalingParams, write_synthetic_tables

#: Never exits: keeps touching a heap block, so lackey's log grows without end.
FOREVER_C = r"""
#include <stdlib.h>
int main(void) {
  volatile long *a = malloc(4096 * sizeof(long));
  for (unsigned long i = 0;; i++) a[i % 4096] += (long)i;
}
"""

#: 50 MiB and a last line to stdout, 256 KiB and a last line to stderr, little tracing.
OUTPUT_C = r"""
#include <string.h>
#include <unistd.h>
static char buf[1 << 20];
static void put(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k <= 0) _exit(3);
    p += k;
    n -= (size_t)k;
  }
}
int main(void) {
  memset(buf, 'x', sizeof buf);
  for (int k = 0; k < 50; k++) put(1, buf, sizeof buf);
  put(1, "END\n", 4);
  for (int k = 0; k < 4; k++) put(2, buf, 65536);
  put(2, "ERR\n", 4);
  return 0;
}
"""

#: Uses the heap from its own code (the preloaded logger sees the block).
HEAP_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  double *p = malloc(64 * sizeof(double));
  double s = 0;
  for (int i = 0; i < 64; i++) p[i] = i;
  for (int i = 0; i < 64; i++) s += p[i];
  printf("%g\n", s);
  free(p);
  return 0;
}
"""

STDOUT_BYTES = 50 * (1 << 20) + 4
STDERR_BYTES = 4 * 65536 + 4


@pytest.fixture
def tools() -> None:
    """Skip where valgrind, gcc or binutils are missing."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install valgrind gcc binutils)")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache root, so the allocation logger is built fresh for the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HPCNB_CACHE", str(root))
    return root


def _build(tmp_path: Path, name: str, src: str) -> Path:
    c, exe = tmp_path / f"{name}.c", tmp_path / name
    c.write_text(src)
    run_bounded(["gcc", "-g", "-O0", "-o", str(exe), str(c)], timeout=120, check=True)
    return exe


@pytest.fixture
def trees(monkeypatch: pytest.MonkeyPatch) -> list[ProcessTree]:
    """Every :class:`ProcessTree` launched during the test."""
    made: list[ProcessTree] = []

    class Recording(ProcessTree):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(hpcnb.launch, "ProcessTree", Recording)
    return made


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder the run's own temporary files go under."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _processes_running(exe: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(exe) in cmdline:
            found.append(proc.pid)
    return found


@pytest.mark.usefixtures("tools", "cache")
def test_growing_log_stops_valgrind_and_everything_it_started(
    tmp_path: Path, trees: list[ProcessTree], private_tmp: Path
) -> None:
    exe = _build(tmp_path, "forever", FOREVER_C)
    limit = 2 << 20
    with pytest.raises(TraceError) as info:
        run_program([str(exe)], max_log_bytes=limit, timeout=300)
    message = str(info.value)
    assert "\n" not in message
    assert f"max_log_bytes={limit}" in message and "--max-log-mib" in message
    assert "ran past" not in message  # stopped by the log's size, not by the timeout
    valgrind = [t for t in trees if t.proc.args[0] == "valgrind"]
    assert len(valgrind) == 1
    assert valgrind[0].leftovers() == []
    assert _processes_running(exe) == []
    assert list(private_tmp.iterdir()) == []  # the log and its folder are gone


@pytest.mark.usefixtures("tools", "cache")
def test_command_line_log_limit_is_one_line_with_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trees: list[ProcessTree]
) -> None:
    exe = _build(tmp_path, "forever", FOREVER_C)
    argv = [
        "commprof",
        "profile",
        "--max-log-mib",
        "1",
        "--timeout",
        "300",
        "--out",
        str(tmp_path / "out"),
        "--",
        str(exe),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"max_log_bytes={1 << 20}" in err and "--max-log-mib" in err
    valgrind = [t for t in trees if t.proc.args[0] == "valgrind"]
    assert [t.leftovers() for t in valgrind] == [[]]
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("tools", "cache")
def test_program_output_streams_to_a_file_and_only_its_tail_is_kept(tmp_path: Path) -> None:
    exe = _build(tmp_path, "output", OUTPUT_C)
    run = run_program([str(exe)])
    assert run.stdout_bytes == STDOUT_BYTES
    assert run.stderr_bytes == STDERR_BYTES
    streams = (
        ("stdout", run.stdout, STDOUT_BYTES, "END\n"),
        ("stderr", run.stderr, STDERR_BYTES, "ERR\n"),
    )
    for name, text, total, last in streams:
        marker, _, tail = text.partition("\n")
        assert marker == f"[... {total - OUTPUT_TAIL_BYTES} earlier bytes of {name} dropped ...]"
        assert len(tail.encode()) == OUTPUT_TAIL_BYTES
        assert tail.endswith("x" + last)


@pytest.mark.usefixtures("tools")
def test_truncated_cached_logger_is_rebuilt_and_heap_programs_trace(
    tmp_path: Path, cache: Path
) -> None:
    so = allocation_logger()
    good = so.read_bytes()
    so.write_bytes(good[:200])  # a write cut short
    exe = _build(tmp_path, "heap", HEAP_C)
    with pytest.warns(UserWarning, match=rf"{so.name}.*rebuilding"):
        run = run_program([str(exe)])
    assert run.stdout == "2016\n"
    assert so.read_bytes() == good
    sidecar = so.with_name(so.name + ".sha256")
    assert sidecar.read_text().strip() == hashlib.sha256(good).hexdigest()
    assert any(o.kind == "heap" for o in parse_trace(run).objects)


def test_logger_with_altered_bytes_is_rebuilt(tmp_path: Path, cache: Path) -> None:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install gcc binutils)")
    so = allocation_logger()
    good = so.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, one byte changed
    so.write_bytes(bytes(bad))
    with pytest.warns(UserWarning, match="SHA-256 differs"):
        assert allocation_logger() == so
    assert so.read_bytes() == good


def test_logger_without_checksum_file_is_rebuilt_quietly(tmp_path: Path, cache: Path) -> None:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install gcc binutils)")
    so = allocation_logger()
    sidecar = so.with_name(so.name + ".sha256")
    digest = sidecar.read_text()
    sidecar.unlink()
    so.write_bytes(b"\x7fELF")  # cut short, and nothing to check it against
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert allocation_logger() == so
    assert sidecar.read_text() == digest
    assert hashlib.sha256(so.read_bytes()).hexdigest() == digest.strip()


def test_two_processes_building_the_logger_at_once_both_succeed(cache: Path) -> None:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install gcc binutils)")
    code = "from hpcnb.commprof.valgrind import allocation_logger; print(allocation_logger())"
    env = dict(os.environ, HPCNB_CACHE=str(cache))
    cmd = [sys.executable, "-c", code]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    procs = [subprocess.Popen(cmd, env=env, text=True, **pipes) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    so = Path(paths.pop())
    assert so.read_bytes()[:4] == b"\x7fELF"
    assert not [p for p in so.parent.iterdir() if p.name.startswith(".build-")]
    assert allocation_logger() == so  # valid: no rebuild, no warning


# ---------------------------------------------------------------- scaling tables


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    """A valid model folder (placements.csv and scalability.csv)."""
    params = ScalingParams(0.01, 0.001, 1e-4, 0.01, 1e-3, 0.05, 0.3)
    return write_synthetic_tables(tmp_path / "model", params)


def _cli_error(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["perfmodel", "validate-scaling", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    return err


def test_over_long_field_names_file_and_line(
    tables: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tables / "placements.csv"
    lines = path.read_text().splitlines()
    lines[3] = "1," + "9" * 200_000 + ",0.1,0.0"  # past csv's own field limit
    path.write_text("\n".join(lines) + "\n")
    err = _cli_error(tables, capsys)
    assert f"{path}: line 4:" in err
    assert f"longer than {scaling.MAX_FIELD_CHARS} characters" in err

    lines[3] = "1,16," + "1" * (scaling.MAX_FIELD_CHARS + 1) + ",0.0"  # within csv's
    path.write_text("\n".join(lines) + "\n")
    assert f"{path}: line 4:" in _cli_error(tables, capsys)


def test_binary_tables_name_file_and_line(tables: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tables / "scalability.csv"
    text = path.read_bytes()
    head, rest = text.split(b"\n", 2)[:2], text.split(b"\n", 2)[2]
    path.write_bytes(b"\n".join(head) + b"\n\xff\xfe\x00garbage\n" + rest)
    err = _cli_error(tables, capsys)
    assert f"{path}: line 3:" in err and "not UTF-8" in err

    path.write_bytes(b"\n".join(head) + b"\n1,2\x00\x00,16,0.1,0.0\n" + rest)
    err = _cli_error(tables, capsys)
    assert f"{path}: line 3:" in err and "NUL" in err

    path.write_bytes(random.Random(0).randbytes(4096))  # random binary data
    err = _cli_error(tables, capsys)
    assert re.search(rf"{re.escape(str(path))}: line \d+: ", err)


def test_oversized_table_is_refused_before_reading(
    tables: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tables / "placements.csv"
    monkeypatch.setattr(scaling, "MAX_TABLE_BYTES", path.stat().st_size - 1)
    err = _cli_error(tables, capsys)
    assert str(path) in err and f"over the limit of {path.stat().st_size - 1} bytes" in err
