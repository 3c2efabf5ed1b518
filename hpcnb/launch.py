"""Launching child processes that can always be stopped, with everything they started.

A notebook run starts papermill, papermill starts a Jupyter kernel in a session of its own,
and the kernel may start MPI ranks, compilers or anything else. Killing papermill's process
group does not reach the kernel. :class:`ProcessTree` therefore marks every process it
launches with a unique token in the environment (``HPCNB_LAUNCH_TOKEN``), which children
inherit, and stops the whole family: every descendant of the launched process (found through
psutil) and every process that carries the token, even one that has been re-parented to
init after its parent died. Processes get ``SIGTERM`` first, then ``SIGKILL`` after a grace
period; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

import psutil

from hpcnb.errors import HpcnbError

__all__ = [
    "TOKEN_VAR",
    "InterruptedRunError",
    "LaunchTimeoutError",
    "ProcessTree",
    "run_bounded",
    "sigterm_as_interrupt",
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


def _has_token(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN_VAR) == token
    except (psutil.Error, OSError):
        return False


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
        **popen: Any,
    ) -> None:
        self.token = uuid.uuid4().hex
        self.grace_s = grace_s
        full_env = dict(os.environ if env is None else env)
        full_env[TOKEN_VAR] = self.token
        self.proc = subprocess.Popen(list(cmd), env=full_env, start_new_session=True, **popen)
        self._known: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            self._known[self.proc.pid] = psutil.Process(self.proc.pid)

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
        for proc in members:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=self.grace_s)
        alive += [p for p in self.members() if p not in alive]  # started during the wait
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
            self.proc.communicate(timeout=5)
        return [p.pid for p in members]

    def leftovers(self) -> list[int]:
        """Return pids of the family still alive (for tests and diagnostics)."""
        deadline = time.monotonic() + 1.0
        while True:
            alive = [p.pid for p in self.members() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LaunchTimeoutError(HpcnbError, TimeoutError):
    """A launched command ran past its time limit (it and its children were stopped)."""


def run_bounded(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion within ``timeout`` seconds, capturing its output.

    Unlike :func:`subprocess.run`, a timeout, Ctrl-C or error stops the command *and*
    every process it started (MPI ranks under ``mpiexec``, for instance), not only the
    command itself.

    Raises:
        LaunchTimeoutError: The command ran past ``timeout`` (everything was stopped).
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
    return subprocess.CompletedProcess(list(cmd), tree.proc.returncode, stdout, stderr)
