"""Cache files that stay whole under concurrent writers and heal themselves when damaged.

Several caches of hpcnb keep measurements in one file per machine (the Winograd wisdom,
the ConvMeter timing cache, the pruning latency tables, the distilled drafts). Two
notebooks, a papermill sweep and a test run may use the same cache at once, and a cache
file may be truncated, edited by hand or damaged on disk. The rules every such cache
follows, with the pieces of this module that implement them:

* **Private temporary, then rename.** A file is never written in place: the bytes go to a
  temporary file of a unique name in the same folder (``tempfile.mkstemp``), are flushed to
  disk and renamed over the final name with ``os.replace`` (:func:`write_private_atomic`).
  A reader sees the old file or the new one, never a part, and two writers never share a
  temporary name.
* **A lock for every merge.** A writer that adds entries to a file other processes also add
  to holds an exclusive lock (``fcntl.flock`` on the sibling file ``<name>.lock``,
  :func:`locked`) while it reads the file again, merges its own entries into what it found
  and writes the result (:func:`update_json`). Two writers therefore keep each other's
  entries; without the lock the later write would drop the entries the earlier one added.
  The wait for the lock is bounded (:data:`LOCK_TIMEOUT_S`); past it
  :class:`CacheLockError` says which file is held. The lock file exists only while it is
  held (or after its holder died, until the next writer takes it over).
* **Validate on read.** A file found in the cache is checked before use (:func:`read_json`
  with the cache's own validator: JSON, field types, finite positive times). One that does
  not validate is ignored with a :class:`CacheWarning` naming the file and the problem; the
  measurement is made again and the file is replaced by the next write.
* **A cache that cannot be written is no cache.** A read-only folder, a full disk or a
  cache path under a regular file turns caching off for that file with one
  :class:`CacheWarning` (:func:`best_effort`); the computation itself goes on.

Example:
    >>> import json, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "counts.json"
    >>> def valid(data):
    ...     if not isinstance(data, dict):
    ...         raise CorruptCacheError("expected an object")
    ...     return data
    >>> update_json(path, lambda old: {**(old or {}), "a": 1}, validate=valid)
    {'a': 1}
    >>> update_json(path, lambda old: {**(old or {}), "b": 2}, validate=valid)
    {'a': 1, 'b': 2}
    >>> read_json(path, valid)
    {'a': 1, 'b': 2}
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpcnb.codecache import atomic_write
from hpcnb.errors import HpcnbError, InvalidInputError

__all__ = [
    "LOCK_TIMEOUT_S",
    "MAX_CACHE_BYTES",
    "CacheLockError",
    "CacheWarning",
    "CorruptCacheError",
    "best_effort",
    "lock_path",
    "locked",
    "read_json",
    "update_json",
    "write_private_atomic",
]

LOCK_TIMEOUT_S = 120.0
"""Default longest wait (seconds) for another process's lock on a cache file."""

MAX_CACHE_BYTES = 256 * 2**20
"""Default largest cache file :func:`read_json` reads (bytes); a larger one is ignored."""

_POLL_S = 0.01
_WARNED_UNWRITABLE: set[str] = set()


class CacheWarning(UserWarning):
    """A cache file was ignored (it does not validate) or cannot be written."""


class CorruptCacheError(HpcnbError, ValueError):
    """A cache file's content does not validate; the message says where and why.

    Validators given to :func:`read_json` and :func:`update_json` raise it.
    """


class CacheLockError(HpcnbError, TimeoutError):
    """Another process held a cache file's lock for longer than the allowed wait."""


def lock_path(path: str | os.PathLike) -> Path:
    """Return the lock file of a cache file: ``<path>.lock`` in the same folder.

    Args:
        path: The cache file.
    """
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _try_lock(lock: Path, fcntl: Any) -> int | None:
    """Lock ``lock`` without waiting: the open descriptor, or None when another holds it.

    The descriptor counts only when, once locked, it is still the file named ``lock`` (a
    holder removes the file before it lets go, so a descriptor of a removed file is stale).
    """
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    try:
        named = os.stat(lock)
    except FileNotFoundError:
        named = None
    held = os.fstat(fd)
    if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
        os.close(fd)  # the holder before us removed this file: lock the new one
        return None
    return fd


@contextlib.contextmanager
def locked(path: str | os.PathLike, *, timeout_s: float | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of the cache file ``path`` for the ``with`` block.

    The lock is ``fcntl.flock`` on :func:`lock_path` (created, with its folder, when
    missing). The holder removes the lock file at the end of the block, before letting go,
    and a waiter that then gets the lock of the removed file tries again on the file now
    named so; the cache folder therefore holds no lock file between writes, and a process
    that dies holding the lock frees it (its file stays, and the next writer reuses it).
    Where ``fcntl`` does not exist (Windows) the block runs without a lock: writes stay
    atomic there, but two concurrent merges may lose entries.

    Args:
        path: The cache file to lock.
        timeout_s: Longest wait for another holder (default :data:`LOCK_TIMEOUT_S`).

    Yields:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        CacheLockError: The lock stayed held for ``timeout_s`` seconds.
        OSError: The lock file cannot be created (read-only folder, a file where the folder
            should be).
    """
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield path
        return
    wait = LOCK_TIMEOUT_S if timeout_s is None else float(timeout_s)
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    while (fd := _try_lock(lock, fcntl)) is None:
        if time.monotonic() >= deadline:
            raise CacheLockError(
                errno.ETIMEDOUT,
                f"cache file {path}: its lock {lock.name} was held by another process for "
                f"more than {wait:g} s",
            )
        time.sleep(_POLL_S)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_private_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a private temporary file and ``os.replace``.

    The temporary file has a unique name in the same folder (``tempfile.mkstemp``), is
    flushed to disk before the rename and is removed on any error, so concurrent writers
    never share it and no reader sees a partial file. Text is written as UTF-8. The folder
    is created when missing. The file is then made readable by others (mode ``0o644``, as
    the run folders' files; the cache folder's own permissions decide who gets in). The
    write is :func:`hpcnb.codecache.atomic_write`.

    Args:
        path: Destination file.
        data: Text or bytes.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: The folder cannot be created or written.
    """
    atomic_write(path, data)
    with contextlib.suppress(OSError):  # another user's file replaced ours meanwhile
        os.chmod(path, 0o644)
    return Path(path)


def _reject_constant(name: str) -> float:
    raise CorruptCacheError(f"non-finite number {name}")


def _load(
    path: Path, validate: Callable[[Any], Any], allow_nan: bool, max_bytes: int
) -> tuple[Any, str | None]:
    """``(validated content, None)``, ``(None, None)`` when missing, or ``(None, problem)``."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return None, None
    except NotADirectoryError:  # a regular file where a folder of the path should be
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if len(raw) > max_bytes:
        return None, f"larger than the limit of {max_bytes} bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start})"
    try:
        data = json.loads(text) if allow_nan else json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
    except CorruptCacheError as exc:
        return None, str(exc)
    except (RecursionError, ValueError) as exc:
        return None, f"not valid JSON ({type(exc).__name__})"
    try:
        return validate(data), None
    except CorruptCacheError as exc:
        return None, str(exc)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return None, f"does not validate ({type(exc).__name__}: {exc})"


def read_json(
    path: str | os.PathLike,
    validate: Callable[[Any], Any],
    *,
    what: str = "cache file",
    allow_nan: bool = False,
    max_bytes: int = MAX_CACHE_BYTES,
    warn: bool = True,
    stacklevel: int = 2,
) -> Any:
    """Return the validated content of a JSON cache file, or None when missing or corrupt.

    A file that is unreadable, larger than ``max_bytes``, not UTF-8, not JSON, or that
    ``validate`` rejects is ignored: the result is None and (with ``warn``) a
    :class:`CacheWarning` names the file and the first problem. The file is left for the
    next write to replace.

    Args:
        path: The cache file.
        validate: Called with the parsed JSON; returns the content to use (the same data or
            a cleaned copy) or raises :class:`CorruptCacheError` (``KeyError``,
            ``TypeError`` and ``ValueError`` count as invalid too).
        what: Name of the cache in the warning (``"perfmodel timing cache"``).
        allow_nan: Accept ``NaN`` and ``Infinity`` in the JSON.
        max_bytes: Largest file read.
        warn: Warn about a corrupt file (False: return None silently).
        stacklevel: Passed to :func:`warnings.warn` (2: the caller of this function).

    Returns:
        What ``validate`` returned, or None.
    """
    path = Path(path)
    data, problem = _load(path, validate, allow_nan, max_bytes)
    if problem is not None and warn:
        warnings.warn(
            f"{what} {path}: ignored, {problem}; measured again, the file is replaced",
            CacheWarning,
            stacklevel=stacklevel,
        )
    return data


def _dumps(data: Any, allow_nan: bool, indent: int | None) -> str:
    if not allow_nan:
        _check_finite(data)
    return json.dumps(data, allow_nan=allow_nan, indent=indent, sort_keys=True) + "\n"


def _check_finite(data: Any) -> None:
    if isinstance(data, float) and not math.isfinite(data):
        raise InvalidInputError(f"non-finite number {data!r} in cache data")
    if isinstance(data, dict):
        for value in data.values():
            _check_finite(value)
    elif isinstance(data, list | tuple):
        for value in data:
            _check_finite(value)


def update_json(
    path: str | os.PathLike,
    merge: Callable[[Any], Any],
    *,
    validate: Callable[[Any], Any],
    allow_nan: bool = False,
    indent: int | None = None,
    max_bytes: int = MAX_CACHE_BYTES,
    timeout_s: float | None = None,
) -> Any:
    """Merge into a JSON cache file under its lock: re-read, ``merge``, write atomically.

    Inside :func:`locked`, the file is read again and validated (a missing or corrupt file
    reads as None, silently: a corrupt one is replaced here); ``merge`` gets that content
    and returns the new content, which :func:`write_private_atomic` writes.

    Args:
        path: The cache file.
        merge: ``merge(current)``: the new content from the current one (None when absent
            or corrupt). It should add this writer's entries to ``current`` rather than
            replace it, so that other writers' entries survive.
        validate: As for :func:`read_json`.
        allow_nan: Write (and read) ``NaN`` and ``Infinity``.
        indent: JSON indentation (None: one line).
        max_bytes: Largest file read.
        timeout_s: Longest wait for the lock (default :data:`LOCK_TIMEOUT_S`).

    Returns:
        The content written.

    Raises:
        CacheLockError: The lock stayed held too long (nothing written).
        OSError: The file or its lock cannot be written.
        ValueError: The merged content holds NaN or infinity and ``allow_nan`` is False.
    """
    path = Path(path)
    with locked(path, timeout_s=timeout_s):
        current, _problem = _load(path, validate, allow_nan, max_bytes)
        new = merge(current)
        write_private_atomic(path, _dumps(new, allow_nan, indent))
    return new


@contextlib.contextmanager
def best_effort(
    path: str | os.PathLike,
    what: str = "cache file",
    *,
    category: type[CacheWarning] = CacheWarning,
) -> Iterator[None]:
    """Turn an ``OSError`` of the ``with`` block into one warning per file.

    For cache writes: a read-only folder, a full disk, a folder path that is a regular
    file or a lock held too long (:class:`CacheLockError`) leave the result uncached
    instead of failing the computation. The first failure for a file in this process warns,
    naming the file and the reason; later failures for the same file are silent.

    Args:
        path: The cache file written in the block.
        what: Name of the cache in the warning.
        category: The warning class (:class:`CacheWarning` or a subclass).

    Yields:
        Nothing; the block's ``OSError`` is suppressed.
    """
    try:
        yield
    except OSError as exc:
        key = str(Path(path))
        if key in _WARNED_UNWRITABLE:
            return
        _WARNED_UNWRITABLE.add(key)
        reason = exc.strerror or str(exc) or type(exc).__name__
        warnings.warn(
            f"{what} {path}: not written ({reason}); the result is used but not cached",
            category,
            stacklevel=3,
        )
