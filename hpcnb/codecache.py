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
* every write is atomic (:func:`atomic_write`: a temporary file in the same folder, then
  ``os.replace``), so a concurrent reader sees the old file or the new one, never half.

Limit: Numba's own cache files (``__pycache__/*.nbi``, ``*.nbc``) hold pickled data that
Numba loads as it finds it. A cache folder writable by someone you do not trust is not
safe for them; keep the cache root (``$HPCNB_CACHE``, :func:`hpcnb.paths.cache_root`)
private.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import types
import warnings
from pathlib import Path

from hpcnb.paths import CACHE_ENV

__all__ = [
    "CodeCacheWarning",
    "atomic_write",
    "deprecated_cache_env",
    "ensure_source",
    "generated_path",
    "load_generated",
    "source_digest",
]

_DIGEST_CHARS = 16
_WARNED_ENV: set[str] = set()


class CodeCacheWarning(UserWarning):
    """A cached generated module differed from the generated text and was rewritten."""


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
    is reported with a :class:`CodeCacheWarning` naming the file and is replaced. At most
    ``len(source) + 1`` bytes of an existing file are read.

    Args:
        path: The cache file.
        source: The module text it must hold.

    Returns:
        True when the file was written (missing or replaced), False when it was correct.

    Raises:
        OSError: The file cannot be written.
    """
    path = Path(path)
    expected = source.encode("utf-8")
    try:
        with open(path, "rb") as fh:
            found = fh.read(len(expected) + 1)
    except FileNotFoundError:
        atomic_write(path, expected)
        return True
    except OSError as exc:
        reason = f"unreadable ({exc.strerror or exc})"
    else:
        if found == expected:
            return False
        reason = _difference(found, expected)
    warnings.warn(
        f"generated module {path}: {reason}; it does not match the generated source and "
        "was written again (nothing of it ran)",
        CodeCacheWarning,
        stacklevel=3,
    )
    atomic_write(path, expected)
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
    ``sys.modules`` under ``module_prefix + file stem``.

    Args:
        source: Module text (what the generator produced now).
        folder: Cache folder (created when missing).
        stem: Readable part of the file name.
        module_prefix: Prefix of the module name in ``sys.modules``.

    Returns:
        The executed module, with ``__file__`` set to the cache file.

    Raises:
        OSError: The cache file cannot be written.
    """
    path = generated_path(folder, stem, source)
    ensure_source(path, source)
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
    return module


def deprecated_cache_env(name: str) -> Path | None:
    """Return the folder named by a deprecated cache variable, when ``$HPCNB_CACHE`` is unset.

    Older versions placed some caches with their own variables (``HPCNB_CACHE_DIR``,
    ``HPCNB_COMMPROF_CACHE``). They are still honoured when the one cache root
    ``HPCNB_CACHE`` is not set, with a ``FutureWarning`` (once per variable and process).

    Args:
        name: The deprecated environment variable.

    Returns:
        Its folder, or None when it is unset or ``HPCNB_CACHE`` is set.
    """
    value = os.environ.get(name)
    if not value or os.environ.get(CACHE_ENV):
        return None
    if name not in _WARNED_ENV:
        _WARNED_ENV.add(name)
        warnings.warn(
            f"${name} is deprecated: set ${CACHE_ENV}, the one cache root of hpcnb",
            FutureWarning,
            stacklevel=3,
        )
    return Path(value).expanduser()
