"""Whether to show progress bars: on in an interactive frontend, off in batch runs.

A tqdm bar writes one stderr output per refresh. In JupyterLab that is a live bar; in a
notebook executed by papermill (``hpcnb run``), nbclient or nbconvert it is stored in the
notebook as hundreds of stderr outputs. :func:`show_progress` makes that decision once,
for every training loop of :mod:`hpcnb.supernet`:

1. an explicit ``True``/``False`` from the caller wins;
2. else the environment variable ``HPCNB_PROGRESS`` (``1``/``0``, ``true``/``false``,
   ``on``/``off``, ``yes``/``no``);
3. else off when the process was started by a batch executor (its parent process's
   command line names ``papermill``, ``nbclient``, ``nbconvert``, ``jupyter-execute`` or
   ``pytest``);
4. else on inside a Jupyter kernel (an interactive frontend) and, outside one, only
   when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BATCH_EXECUTORS", "show_progress"]

BATCH_EXECUTORS = ("papermill", "nbclient", "nbconvert", "jupyter-execute", "pytest")
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def _parent_cmdline(pid: int | None = None) -> str:
    """Return the parent process's command line ("" where it cannot be read)."""
    ppid = os.getppid() if pid is None else pid
    try:
        raw = Path(f"/proc/{ppid}/cmdline").read_bytes()
    except OSError:
        try:
            import psutil

            return " ".join(psutil.Process(ppid).cmdline())
        except Exception:  # psutil absent or no permission: parent unknown
            return ""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace")


def _in_kernel() -> bool:
    """Tell whether this process is a Jupyter (IPython) kernel."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - ipykernel implies IPython
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _stderr_is_tty() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def show_progress(
    requested: bool | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    parent_cmdline: str | None = None,
) -> bool:
    """Decide whether a loop shows a progress bar.

    Args:
        requested: The caller's explicit choice; ``None`` decides automatically.
        environ: Environment to read ``HPCNB_PROGRESS`` from (default ``os.environ``).
        parent_cmdline: The parent process's command line (default: read from ``/proc``
            or psutil); for tests.

    Returns:
        ``True`` to show progress bars.

    Raises:
        ValueError: ``HPCNB_PROGRESS`` holds something other than a yes/no word.
    """
    if requested is not None:
        return bool(requested)
    env = os.environ if environ is None else environ
    value = env.get("HPCNB_PROGRESS", "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    if value:
        raise ValueError(f"HPCNB_PROGRESS={value!r}: expected one of {', '.join(_TRUE + _FALSE)}")
    parent = _parent_cmdline() if parent_cmdline is None else parent_cmdline
    if any(name in parent for name in BATCH_EXECUTORS):
        return False
    return _in_kernel() or _stderr_is_tty()
