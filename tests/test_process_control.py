"""Nothing orphaned: killed runs and workers, interrupted sweeps, foreign schedulers.

Every process a test starts inherits a marker variable with a value unique to the test;
after the test, a scan of every process's environment must find none carrying it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from _nbutil import make_notebook
from hpcnb.launch import ProcessTree, stop_marked
from hpcnb.parameters import ParameterError
from hpcnb.runfolder import RunFolderError, locked_run_folder
from hpcnb.sweep import sweep

PARAMS = "SMOKE: bool = False  # tiny\nA: int = 1  # a value\n"
MARK = "HPCNB_TEST_MARKER"


def _marked(value: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            mine = proc.pid != os.getpid() and proc.environ().get(MARK) == value
            if mine and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _wait_gone(value: str, seconds: float = 30.0) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _marked(value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _first_pid_file(folder: Path, seconds: float = 180.0) -> Path:
    """Wait for the first ``pids_*`` file a sleeper notebook writes; return it."""
    deadline = time.monotonic() + seconds
    while not (found := sorted(folder.glob("pids_*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found, f"no pids_* file appeared in {folder}"
    time.sleep(0.3)
    return found[0]


@pytest.fixture
def marker():
    value = uuid.uuid4().hex
    yield value
    stop_marked(MARK, value, grace_s=1)  # whatever a failed test left behind


def _sleeper(tmp_path: Path, ignore_term: bool = False) -> Path:
    """A notebook that writes its kernel's and a child's pids, then sleeps."""
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
    return make_notebook(
        tmp_path / "sleeper.ipynb",
        PARAMS,
        f"{ignore}import os, subprocess, time, pathlib\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        f"pathlib.Path({str(tmp_path)!r}, f'pids_{{A}}_{{os.getpid()}}').write_text("
        "f'{os.getpid()} {child.pid}')\n"
        "time.sleep(600)",
    )


def test_a_watchdog_stops_the_family_of_a_killed_launcher(tmp_path, marker):
    script = (
        "import sys, time\n"
        "from hpcnb.launch import ProcessTree\n"
        "tree = ProcessTree(['sleep', '600'], watchdog=True)\n"
        "print(tree.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, MARK: marker}
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(launcher.stdout.readline())
    assert psutil.pid_exists(child)
    launcher.kill()  # no clean-up runs in the launcher
    launcher.wait(timeout=30)
    assert _wait_gone(marker) == []
    tree = ProcessTree([sys.executable, "-c", "pass"], watchdog=True)
    tree.communicate(timeout=60)
    tree.stop()
    assert tree.leftovers() == [] and tree._watchdog is None


def test_sigkill_of_hpcnb_run_leaves_nothing_and_resume_waits(tmp_path, marker):
    nb = _sleeper(tmp_path, ignore_term=True)
    out = tmp_path / "run"
    env = {**os.environ, MARK: marker}
    run = subprocess.Popen(
        [sys.executable, "-m", "hpcnb", "run", str(nb), "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    kernel = psutil.Process(int(_first_pid_file(tmp_path).read_text().split()[0]))
    run.kill()
    run.wait(timeout=30)
    # The kernel ignores SIGTERM, so the watchdog holds the folder through its grace period.
    if kernel.is_running() and kernel.status() != psutil.STATUS_ZOMBIE:
        with pytest.raises(RunFolderError, match="in use"), locked_run_folder(out, resume=True):
            pass
    assert _wait_gone(marker) == [], "papermill, the kernel or its child survived"
    with locked_run_folder(out, resume=True):
        pass  # free once the family is gone


def _worker_of(kernel_pid: int) -> psutil.Process:
    """The Dask worker that launched the papermill whose kernel is ``kernel_pid``."""
    proc = psutil.Process(kernel_pid)
    while (parent := proc.parent()) is not None:
        if "papermill" in " ".join(proc.cmdline()):
            return parent
        proc = parent
    raise AssertionError("no papermill above the kernel")


def test_a_killed_worker_takes_its_notebook_along_and_ctrl_c_stops_the_sweep(tmp_path, marker):
    nb = _sleeper(tmp_path)
    grid = tmp_path / "g.yaml"
    grid.write_text("A: [1]\n")
    out = tmp_path / "out"
    env = {**os.environ, MARK: marker}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcnb",
            "sweep",
            str(nb),
            "--grid",
            str(grid),
            "--workers",
            "1",
            "--out",
            str(out),
            "--timeout",
            "500",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = _first_pid_file(tmp_path)
        kernel_pid, child_pid = (int(p) for p in first.read_text().split())
        worker = _worker_of(kernel_pid)
        worker.kill()
        deadline = time.monotonic() + 30
        while (psutil.pid_exists(kernel_pid) or psutil.pid_exists(child_pid)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        for pid in (kernel_pid, child_pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"{pid} orphaned"
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert _wait_gone(marker) == [], "a worker, papermill or kernel survived Ctrl-C"
    rows = (out / "sweep.csv").read_text().splitlines()
    assert rows[0].startswith("A,run,status") and len(rows) == 2
    assert ",interrupted," in rows[1]


def _serve(handler) -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return server, server.getsockname()[1]


def _silent(conn: socket.socket) -> None:
    time.sleep(60)
    conn.close()


def _garbage(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(os.urandom(4096))
        time.sleep(1)
        conn.close()


def _http(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        time.sleep(1)
        conn.close()


def _refused(nb: Path, out: Path, handler, timeout: float, match: str) -> None:
    """A sweep pointed at ``handler``'s server must fail with ``match``, writing nothing."""
    server, port = _serve(handler)
    try:
        with pytest.raises(ParameterError, match=match):
            sweep(
                nb,
                {"A": [1]},
                scheduler=f"tcp://127.0.0.1:{port}",
                out=out,
                connect_timeout=timeout,
            )
    finally:
        server.close()
    assert not out.exists()


@pytest.mark.parametrize("handler", [_silent, _garbage, _http])
def test_a_scheduler_that_is_not_dask_fails_in_one_line(tmp_path, handler):
    nb = make_notebook(tmp_path / "s.ipynb", PARAMS, "A")
    _refused(nb, tmp_path / "o", handler, 3, "no Dask scheduler reachable within 3 s")


def test_sweep_points_run_with_their_tokens_and_leave_nothing(tmp_path, marker, monkeypatch):
    nb = make_notebook(
        tmp_path / "s.ipynb",
        PARAMS,
        "import os\nfrom hpcnb import record\n"
        "record('s.token', float(bool(os.environ.get('HPCNB_SWEEP_TOKEN'))))",
    )
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # this test process's helper, not the sweep's
    monkeypatch.setenv(MARK, marker)
    table = sweep(nb, {"A": [1, 2]}, workers=1, out=tmp_path / "o", timeout=300)
    assert list(table["s.token"]) == [1.0, 1.0]
    assert "HPCNB_SWEEP_TOKEN" not in os.environ
    assert _wait_gone(marker, 20) == []
    json.loads((tmp_path / "o" / "run.json").read_text())


def test_a_real_scheduler_works_after_foreign_peers_were_refused(tmp_path):
    from dask.distributed import LocalCluster

    nb = make_notebook(tmp_path / "s.ipynb", PARAMS, "from hpcnb import record\nrecord('s.a', A)")
    _refused(nb, tmp_path / "o", _silent, 2, "no Dask handshake")
    saved = dict(os.environ)  # Dask's nanny writes its worker settings into os.environ
    try:
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
            table = sweep(
                nb,
                {"A": [3, 4]},
                scheduler=cluster.scheduler_address,
                out=tmp_path / "real",
                timeout=300,
            )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert list(table["s.a"]) == [3.0, 4.0] and (table["status"] == "ok").all()


def test_a_local_sweep_leaves_the_callers_environment_as_it_was(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    nb = make_notebook(tmp_path / "s.ipynb", PARAMS, "A")
    table = sweep(nb, {"A": [1]}, workers=1, out=tmp_path / "o", timeout=300)
    assert (table["status"] == "ok").all()
    assert dict(os.environ) == before
