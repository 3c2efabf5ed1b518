"""Tests of hpcnb.launch's MPI launcher: command line, errors, and no rank left behind."""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from hpcnb.errors import HpcnbError
from hpcnb.launch import MPIRunError, mpiexec_command, mpiexec_path, run_mpi

# Every rank writes its pid to DIR/pid_RANK, then rank 0 exits and the others act.
RANK_SCRIPT = """
import os, sys, time
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
open(os.path.join(sys.argv[1], f"pid_{rank}"), "w").write(str(os.getpid()))
if rank > 0:
    if sys.argv[2] == "hang":
        time.sleep(600)
    if sys.argv[2] == "fail":
        sys.stderr.write(f"rank {rank}: boom\\n")
        sys.exit(3)
print(f"rank {rank} done")
"""


def _program(tmp_path: Path, action: str) -> list[str]:
    return [sys.executable, "-c", RANK_SCRIPT, str(tmp_path), action]


def _pids(tmp_path: Path, n: int) -> list[int]:
    """The pids the ranks wrote, once ``n`` files hold one (a file can exist still empty)."""
    deadline = time.monotonic() + 30
    while True:
        texts = [p.read_text().strip() for p in tmp_path.glob("pid_*")]
        pids = [int(t) for t in texts if t.isdigit()]
        if len(pids) >= n or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_mpi_run_error_is_a_project_error() -> None:
    assert issubclass(MPIRunError, HpcnbError) and issubclass(MPIRunError, RuntimeError)


def test_missing_mpiexec_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MPIRunError, match="mpiexec not found"):
        mpiexec_path()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        mpiexec_command(0)
    with pytest.raises(ValueError, match="timeout_s"):
        run_mpi([sys.executable], 2, timeout_s=0)


@pytest.mark.mpi
def test_command_line_and_successful_job(tmp_path: Path) -> None:
    cmd = mpiexec_command(2, bind_to="none")
    assert cmd[-2:] == ["-n", "2"] and "--oversubscribe" in cmd
    assert cmd[cmd.index("--bind-to") + 1] == "none"
    done = run_mpi(_program(tmp_path, "ok"), 2, timeout_s=120)
    assert "rank 0 done" in done.stdout and "rank 1 done" in done.stdout


@pytest.mark.mpi
def test_failed_rank_raises_with_output_tail(tmp_path: Path) -> None:
    with pytest.raises(MPIRunError, match="rank 1: boom") as err:
        run_mpi(_program(tmp_path, "fail"), 2, timeout_s=120)
    assert "failed (exit" in str(err.value)
    assert not any(_alive(pid) for pid in _pids(tmp_path, 2))


@pytest.mark.mpi
def test_hanging_rank_is_killed_within_the_limit(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(MPIRunError, match="did not finish within 8 s"):
        run_mpi(_program(tmp_path, "hang"), 2, timeout_s=8)
    assert time.monotonic() - t0 < 8 + 30  # the limit, the stop's grace, slack for a busy machine
    pids = _pids(tmp_path, 2)
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)  # no rank left behind


@pytest.mark.mpi
def test_interrupt_stops_every_rank(tmp_path: Path) -> None:
    def interrupt_when_started() -> None:
        _pids(tmp_path, 2)
        time.sleep(0.5)
        _thread.interrupt_main()

    # interrupt_main does nothing where SIGINT is ignored (as a test worker may have it):
    # Python's own Ctrl-C handler for the test, whatever ran before it in this process.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_when_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_mpi(_program(tmp_path, "hang"), 2, timeout_s=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    pids = _pids(tmp_path, 2)
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
