"""Progress bars that are live in JupyterLab and quiet in batch runs.

A tqdm bar writes one output per refresh. In JupyterLab (with ``ipywidgets``) that is a
live widget; in a notebook executed by papermill (``hpcnb run``), nbclient or nbconvert
every refresh would be stored in the notebook as a stderr output. :func:`progress` wraps
an iterable either way: a ``tqdm.auto`` bar when :func:`show_progress` says so, otherwise
a quiet iterator that prints one summary line when the loop ends
(``autotune conv3: 48 steps in 12.3 s``).

:func:`show_progress` decides once per call:

1. an explicit ``True``/``False`` from the caller wins;
2. else the environment variable ``HPCNB_PROGRESS`` (``1``/``0``, ``true``/``false``,
   ``on``/``off``, ``yes``/``no``);
3. else off under ``hpcnb run`` (which sets ``HPCNB_BATCH=1`` for its kernels) and when
   the process was started by a batch executor (its parent's command line names
   ``papermill``, ``nbclient``, ``nbconvert``, ``jupyter-execute`` or ``pytest``);
4. else on inside a Jupyter kernel and, outside one, only when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hpcnb.errors import InvalidInputError

__all__ = ["BATCH_EXECUTORS", "QuietProgress", "progress", "show_progress"]

T = TypeVar("T")
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
    """Decide whether a loop shows a live progress bar.

    Args:
        requested: The caller's explicit choice; ``None`` decides automatically.
        environ: Environment to read ``HPCNB_PROGRESS``/``HPCNB_BATCH`` from (default
            ``os.environ``).
        parent_cmdline: The parent process's command line (default: read from ``/proc``
            or psutil); for tests.

    Returns:
        ``True`` to show live bars.

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
        raise InvalidInputError(
            f"HPCNB_PROGRESS={value!r}: expected one of {', '.join(_TRUE + _FALSE)}"
        )
    if env.get("HPCNB_BATCH", "").strip().lower() in _TRUE:
        return False
    parent = _parent_cmdline() if parent_cmdline is None else parent_cmdline
    if any(name in parent for name in BATCH_EXECUTORS):
        return False
    return _in_kernel() or _stderr_is_tty()


class QuietProgress(Iterator[T]):
    """Iterate without a bar; print one summary line when the loop ends.

    Args:
        iterable: What to iterate over.
        desc: Label of the summary line.
        unit: Name of one step in the summary line.
        summary: Print the summary line (``False``: silent).
    """

    def __init__(
        self, iterable: Iterable[T], desc: str = "", unit: str = "steps", summary: bool = True
    ) -> None:
        self._it = iter(iterable)
        self.desc = desc
        self.unit = unit
        self.summary = summary
        self.count = 0
        self._start = time.perf_counter()
        self._done = False

    def __iter__(self) -> QuietProgress[T]:
        return self

    def __next__(self) -> T:
        try:
            item = next(self._it)
        except StopIteration:
            self.close()
            raise
        self.count += 1
        return item

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        """Accept tqdm's ``set_postfix`` and ignore it.

        Args:
            *args: Ignored.
            **kwargs: Ignored.
        """

    def set_description(self, desc: str = "", *args: Any, **kwargs: Any) -> None:
        """Accept tqdm's ``set_description``: it becomes the summary's label.

        Args:
            desc: The label of the summary line.
            *args: Ignored.
            **kwargs: Ignored.
        """
        self.desc = desc

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps (tqdm's manual mode)."""
        self.count += n

    def close(self) -> None:
        """Print the summary line once."""
        if self._done:
            return
        self._done = True
        if self.summary:
            label = f"{self.desc}: " if self.desc else ""
            took = time.perf_counter() - self._start
            print(f"{label}{self.count} {self.unit} in {took:.1f} s", flush=True)


def progress(
    iterable: Iterable[T],
    *,
    desc: str = "",
    total: int | None = None,
    unit: str = "steps",
    enabled: bool | None = None,
    **tqdm_kwargs: Any,
) -> Iterator[T]:
    """Wrap ``iterable`` with a live bar or a quiet one-line summary (see module docs).

    Args:
        iterable: What to iterate over.
        desc: Label of the bar or summary line.
        total: Number of steps, when ``len(iterable)`` is not known.
        unit: Name of one step.
        enabled: Force the live bar on or off (``None``: :func:`show_progress`).
        **tqdm_kwargs: Passed to tqdm for the live bar.
    """
    if not show_progress(enabled):
        return QuietProgress(iterable, desc=desc, unit=unit)
    from tqdm import TqdmWarning

    with warnings.catch_warnings():  # without ipywidgets tqdm.auto falls back to text
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc or None, total=total, unit=unit, **tqdm_kwargs)
