"""Generated Python modules in a cache folder, verified before they run.

Two code generators of hpcnb write the module text they generate to a cache folder and
run it from there, so that Numba's on-disk cache (``cache=True``, keyed on the source
file) keeps the compiled machine code between sessions: the Winograd kernels
(:mod:`hpcnb.winograd.codegen`) and the instrumented kernels of
:mod:`hpcnb.commprof.instrument`. A cache folder may be shared, copied or written by
another process, so a file found there is never trusted:

* the file is named ``<stem>_<digest>.py``, ``digest`` being the first 16 hex digits of
  the SHA-256 of the generated text (:func:`source_digest`), so one name has one correct
  content;
* before the module runs, the file's bytes are compared with the text generated now
  (:func:`ensure_source`); on a mismatch (a line appended, a truncated write) a
  :class:`CodeCacheWarning` names the file and it is written again;
* the module is executed from the generated text held in memory, compiled under the
  file's name (:func:`load_generated`), never from the file or from a ``.pyc`` in
  ``__pycache__``, so a change made to the file after the check cannot run either;
* every write is atomic (:func:`atomic_write`: a temporary file with a private name made
  by ``mkstemp`` in the same folder, then ``os.replace``), so a concurrent reader sees
  the old file or the new one, never half, and processes writing the same module at
  once all succeed.

A damaged or unwritable cache does not stop the computation:

* a Numba cache entry that cannot be loaded (a truncated or overwritten ``.nbi`` index or
  ``.nbc`` data file: ``UnpicklingError``, ``EOFError``, ``ValueError``, an LLVM parse
  error, ...) is dropped: a :class:`CodeCacheWarning` names the removed files, the
  function is compiled again and its cache written anew (:func:`guard_numba_cache`,
  applied to every module :func:`load_generated` runs);
* when the cache folder (or its ``__pycache__``) cannot be written (permissions, a
  read-only file system, a path through a regular file), a :class:`CodeCacheWarning`
  names the folder once and the generated modules run from a private temporary folder
  removed at exit, so their machine code is compiled in each session; a Numba cache
  write that fails later (a full disk) is skipped instead, with one warning per folder,
  and the compiled function stays in memory. Only when no temporary folder can
  be written either does :func:`load_generated` raise ``OSError``.

Limit: Numba's cache files hold pickled data, and loading a pickle can run code: a
damaged file is detected when Numba fails to load it, but a file crafted by someone who
can write to the cache folder runs as it is loaded. A cache folder writable by someone
you do not trust is not safe; keep the cache root (``$HPCNB_CACHE``,
:func:`hpcnb.paths.cache_root`) private. Damage that still loads (altered machine code
that still parses) is not detected.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from hpcnb.errors import HpcnbError

__all__ = [
    "CodeCacheError",
    "CodeCacheWarning",
    "atomic_write",
    "ensure_source",
    "generated_path",
    "guard_numba_cache",
    "load_generated",
    "source_digest",
]

_DIGEST_CHARS = 16
_WARNED_FOLDERS: set[str] = set()
_PRIVATE_FOLDER: Path | None = None
_GUARD_MARK = "_hpcnb_guarded"


class CodeCacheError(HpcnbError, OSError):
    """A generated module can be written neither to the cache folder nor to a private one."""


class CodeCacheWarning(UserWarning):
    """A generated-code cache file was altered, unreadable or could not be written.

    The file was written again, dropped and rebuilt, or bypassed; the computation went on.
    """


def source_digest(source: str) -> str:
    """Return the first 16 hex digits of the SHA-256 of ``source`` (UTF-8).

    Args:
        source: Module text.

    Returns:
        The digest that names the cached file of this text.
    """
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]


def generated_path(folder: str | os.PathLike, stem: str, source: str) -> Path:
    """Return the cache file of ``source``: ``folder / f"{stem}_{digest}.py"``.

    Args:
        folder: Cache folder.
        stem: Readable part of the file name (a Python identifier).
        source: Module text.

    Returns:
        The path (not created).
    """
    return Path(folder) / f"{stem}_{source_digest(source)}.py"


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file.

    The data goes to a temporary file in the same folder, is flushed to disk and then
    renamed over ``path`` with ``os.replace`` (atomic on POSIX and Windows). Text is
    written as UTF-8, unchanged. The folder is created when missing.

    Args:
        path: Destination file.
        data: Text or bytes.

    Raises:
        OSError: The folder cannot be created or written; no temporary file is left.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ensure_source(path: str | os.PathLike, source: str) -> bool:
    """Make ``path`` hold exactly ``source``, warning when a stale or altered file was there.

    A file that already holds exactly the UTF-8 bytes of ``source`` is left untouched (so
    Numba's cache keyed on it stays valid); a missing file is written; any other content
    is reported with a :class:`CodeCacheWarning` naming the file and is replaced (the
    warning says so when the replacement cannot be written). At most ``len(source) + 1``
    bytes of an existing file are read.

    Args:
        path: The cache file.
        source: The module text it must hold.

    Returns:
        True when the file was written (missing or replaced), False when it was correct.

    Raises:
        OSError: The file is missing or differs, and cannot be written.
    """
    path = Path(path)
    expected = source.encode("utf-8")
    try:
        with open(path, "rb") as fh:
            found = fh.read(len(expected) + 1)
    except (FileNotFoundError, NotADirectoryError):  # missing, or its folder cannot exist
        atomic_write(path, expected)
        return True
    except OSError as exc:
        reason = f"unreadable ({exc.strerror or exc})"
    else:
        if found == expected:
            return False
        reason = _difference(found, expected)
    try:
        atomic_write(path, expected)
    except OSError as exc:
        warnings.warn(
            f"generated module {path}: {reason}; it does not match the generated source and "
            f"could not be written again ({exc.strerror or exc}); nothing of it ran",
            CodeCacheWarning,
            stacklevel=3,
        )
        raise
    warnings.warn(
        f"generated module {path}: {reason}; it does not match the generated source and "
        "was written again (nothing of it ran)",
        CodeCacheWarning,
        stacklevel=3,
    )
    return True


def _difference(found: bytes, expected: bytes) -> str:
    """Describe how ``found`` differs from ``expected`` in a few words."""
    if len(found) > len(expected) and found.startswith(expected):
        return "content appended after the generated source"
    if len(found) < len(expected) and expected.startswith(found):
        return f"truncated ({len(found)} of {len(expected)} bytes)"
    at = next(i for i, (a, b) in enumerate(zip(found, expected, strict=False)) if a != b)
    line = expected.count(b"\n", 0, at) + 1
    return f"content differs from line {line}"


def load_generated(
    source: str, folder: str | os.PathLike, stem: str, *, module_prefix: str = ""
) -> types.ModuleType:
    """Verify (or write) the cache file of ``source`` and execute ``source`` as a module.

    The file ``generated_path(folder, stem, source)`` is made to hold exactly ``source``
    (:func:`ensure_source`, which warns about and replaces altered content). The module is
    then executed from ``source`` itself, compiled under the file's name, so functions
    report that file (Numba's ``cache=True``, ``inspect.getsource`` and tracebacks work)
    while nothing read back from the folder runs. The module is entered in
    ``sys.modules`` under ``module_prefix + file stem``, and the Numba caches of its
    functions are guarded (:func:`guard_numba_cache`): an entry that cannot be loaded is
    dropped with a warning and compiled again.

    When ``folder`` or its ``__pycache__`` (where Numba writes) cannot be written, a
    :class:`CodeCacheWarning` names the folder (once per folder and process) and the file
    goes to a private temporary folder of this process instead, removed at exit: the
    module runs, but its compiled code is not kept for the next session.

    Args:
        source: Module text (what the generator produced now).
        folder: Cache folder (created when missing).
        stem: Readable part of the file name.
        module_prefix: Prefix of the module name in ``sys.modules``.

    Returns:
        The executed module, with ``__file__`` set to its file (in ``folder``, or in the
        temporary folder when ``folder`` cannot be written).

    Raises:
        OSError: Neither ``folder`` nor a temporary folder can be written.
    """
    path = generated_path(folder, stem, source)
    try:
        ensure_source(path, source)
        _check_writable(path.parent / "__pycache__")
    except OSError as exc:
        _warn_folder(
            path.parent,
            exc,
            "generated modules run from a private temporary folder removed at exit, so "
            "their compiled code is not kept between sessions",
        )
        try:
            fallback = generated_path(_private_folder(), stem, source)
            ensure_source(fallback, source)
        except OSError as second:
            raise CodeCacheError(
                f"cannot write the generated module {path.name}: neither the cache folder "
                f"{path.parent} ({exc}) nor a temporary folder ({second}) can be written"
            ) from second
        path = fallback
    name = module_prefix + path.stem
    code = compile(source, str(path), "exec", dont_inherit=True)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)  # the text generated now, not the file's
    except BaseException:
        sys.modules.pop(name, None)
        raise
    guard_numba_cache(module.__dict__)
    return module


def _check_writable(folder: Path) -> None:
    """Create ``folder`` and a temporary file in it, as Numba does before it caches there.

    Raises:
        OSError: The folder cannot be created or written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tempfile.TemporaryFile(dir=folder).close()


def _private_folder() -> Path:
    """Return this process's temporary folder of generated modules (removed at exit)."""
    global _PRIVATE_FOLDER
    if _PRIVATE_FOLDER is None or not _PRIVATE_FOLDER.is_dir():
        _PRIVATE_FOLDER = Path(tempfile.mkdtemp(prefix="hpcnb-generated-"))
        atexit.register(shutil.rmtree, _PRIVATE_FOLDER, ignore_errors=True)
    return _PRIVATE_FOLDER


def _warn_folder(folder: Path, exc: BaseException, consequence: str) -> None:
    """Warn once per folder and process that ``folder`` cannot be written."""
    key = str(folder)
    if key in _WARNED_FOLDERS:
        return
    _WARNED_FOLDERS.add(key)
    reason = getattr(exc, "strerror", None) or exc
    warnings.warn(
        f"cache folder {folder} cannot be written ({reason}); {consequence}",
        CodeCacheWarning,
        stacklevel=4,
    )


def guard_numba_cache(namespace: MutableMapping[str, Any]) -> list[str]:
    """Make the Numba on-disk caches of the functions in ``namespace`` fail safe.

    Every Numba dispatcher in ``namespace`` (a module's ``__dict__``) compiled with
    ``cache=True`` gets two guards, installed once:

    * loading: when its cache entry cannot be loaded (Numba's pickled ``.nbi`` index or
      ``.nbc`` data truncated, overwritten, or holding machine code that does not parse),
      its index and data files are removed, a :class:`CodeCacheWarning` names them and
      the function is compiled again as on a cache miss (Numba then writes a new cache);
      when the files cannot be removed, its cache is switched off for this process;
    * saving: when the cache cannot be written (a read-only folder, a full disk), its
      cache is switched off for this process with a :class:`CodeCacheWarning` naming the
      folder (once per folder); the compiled function is used from memory.

    Without Numba imported there are no dispatchers and nothing is done.

    Args:
        namespace: Names to scan (module globals).

    Returns:
        The names whose caches were guarded by this call.
    """
    dispatcher_module = sys.modules.get("numba.core.dispatcher")
    caching = sys.modules.get("numba.core.caching")
    if dispatcher_module is None or caching is None:
        return []
    guarded = []
    for name, obj in list(namespace.items()):
        if not isinstance(obj, dispatcher_module.Dispatcher):
            continue
        cache = getattr(obj, "_cache", None)
        if not isinstance(cache, caching.Cache) or getattr(cache, _GUARD_MARK, False):
            continue
        _guard(cache, getattr(obj.py_func, "__qualname__", name))
        guarded.append(name)
    return guarded


def _guard(cache: Any, label: str) -> None:
    """Wrap ``cache.load_overload`` and ``cache.save_overload`` of one Numba ``Cache``."""
    index = Path(cache._cache_file._index_path)
    load: Callable[..., Any] = cache.load_overload
    save: Callable[..., Any] = cache.save_overload

    def load_overload(*args: Any, **kwargs: Any) -> Any:
        try:
            return load(*args, **kwargs)
        except Exception as exc:  # any entry that does not load: compile instead
            dropped, kept = _drop_cache_files(index)
            what = f"{type(exc).__name__}: {exc}"
            if kept:
                cache.disable()
                tail = (
                    f"; could not remove {', '.join(map(str, kept))}, so its cache is off "
                    "in this process"
                )
            else:
                tail = "; it is compiled again and cached anew"
            removed = ", ".join(map(str, dropped)) or "nothing"
            warnings.warn(
                f"Numba cache of {label} could not be loaded ({what}); removed {removed}{tail}",
                CodeCacheWarning,
                stacklevel=2,
            )
            return None

    def save_overload(*args: Any, **kwargs: Any) -> None:
        try:
            save(*args, **kwargs)
        except Exception as exc:  # a cache that cannot be written is skipped
            cache.disable()
            _warn_folder(
                index.parent,
                exc,
                f"the compiled code of {label} and of other functions cached there is "
                "kept in memory, for this process only",
            )

    cache.load_overload = load_overload
    cache.save_overload = save_overload
    setattr(cache, _GUARD_MARK, True)


def _drop_cache_files(index: Path) -> tuple[list[Path], list[Path]]:
    """Remove a Numba index file and its data files; return (removed, not removable)."""
    base = index.name[: -len(".nbi")]
    data = re.compile(re.escape(base) + r"\.\d+\.nbc")
    try:
        found = [p for p in index.parent.iterdir() if p == index or data.fullmatch(p.name)]
    except OSError:
        found = [index]
    removed, kept = [], []
    for p in sorted(found):
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            kept.append(p)
        else:
            removed.append(p)
    return removed, kept
