"""The registry of real data: checksummed files found locally or fetched with pooch.

Every real-data file the notebooks use (cluster traces, measured deep-learning step
times, the ElastiSim example) is described in ``registry.toml`` beside this module (the
top-level ``data/registry.toml`` links to it): its logical name (its path inside a data
folder, e.g. ``swf/hpc2n-seth-first3170.swf``), the source URL at a pinned commit, its
sha256 and size, licence and citation. The files themselves are never part of the
project.

Lookup order for a file, always verified against the registry's sha256:

1. the folder named by ``HPCNB_DATA`` (offline use; tests and CI point it at a copy);
2. the download cache, ``<cache root>/data`` (``HPCNB_CACHE`` or the user cache folder);
3. only in :func:`fetch`: a download with pooch, from the source URL or, when
   ``HPCNB_DATA_MIRROR`` is set, from ``$HPCNB_DATA_MIRROR/<logical name>``.

Otherwise :class:`DataNotFoundError` names the file, the URL and the command that fetches
it. A file whose checksum does not match is never used and never silently replaced:
:class:`ChecksumError` names the expected and the actual hash.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from hpcnb.errors import HpcnbError
from hpcnb.paths import cache_root

ENV_VAR = "HPCNB_DATA"
MIRROR_VAR = "HPCNB_DATA_MIRROR"
#: When set (by ``hpcnb run``), every lookup of a registered file appends a line
#: ``<name>\t<sha256 or "missing">`` to this file, so a cached re-run can tell whether the
#: real data a notebook read (or missed) has changed since.
LOG_VAR = "HPCNB_DATA_LOG"
MISSING = "missing"
FETCH_COMMAND = "hpcnb data fetch"
DEFAULT_TIMEOUT_S = 30.0

__all__ = [
    "ENV_VAR",
    "LOG_VAR",
    "MIRROR_VAR",
    "ChecksumError",
    "DataFile",
    "DataNotFoundError",
    "DownloadError",
    "available",
    "cache_folder",
    "data_dir",
    "data_path",
    "fetch",
    "fetch_all",
    "files_read",
    "large_files",
    "lookup_state",
    "path",
    "registry",
    "stand_in_notice",
    "verify",
]


class DataNotFoundError(HpcnbError, FileNotFoundError):
    """A data file asked for is not available locally (and was not fetched)."""


class ChecksumError(HpcnbError, ValueError):
    """A data file's sha256 differs from the registry's: the file is not used."""


class DownloadError(HpcnbError, OSError):
    """A download failed (unreachable server, timeout, HTTP error, wrong checksum)."""


@dataclass(frozen=True)
class DataFile:
    """One registry entry.

    Attributes:
        name: Logical name, the file's path inside a data folder.
        url: Source URL at a pinned commit.
        sha256: Hex digest of the file.
        size: Size in bytes.
        licence: Licence of the file (or of the repository it comes from).
        citation: What to cite when using it.
    """

    name: str
    url: str
    sha256: str
    size: int
    licence: str
    citation: str


@lru_cache(maxsize=2)
def _table(kind: str) -> dict[str, DataFile]:
    """The ``[files]`` or ``[large_files]`` table of the shipped registry, as DataFiles."""
    text = resources.files("hpcnb.data").joinpath("registry.toml").read_text(encoding="utf-8")
    out = {}
    for name, entry in tomllib.loads(text).get(kind, {}).items():
        try:
            out[name] = DataFile(
                name=name,
                url=str(entry["url"]),
                sha256=str(entry["sha256"]).lower(),
                size=int(entry["size"]),
                licence=str(entry["licence"]),
                citation=str(entry["citation"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HpcnbError(f"registry.toml: entry {name!r} is malformed ({exc})") from exc
    return out


def registry() -> dict[str, DataFile]:
    """Return the registry, ``{logical name: DataFile}``, read from the package data.

    Raises:
        HpcnbError: The shipped registry is malformed (a packaging error).
    """
    return dict(_table("files"))


def large_files() -> dict[str, DataFile]:
    """Return the registry's ``large_files`` table: files fetched only when asked for.

    They are too large for the offline test copy and for ``hpcnb data fetch --all``
    (e.g. the 170 MB CIFAR-10 archive); see :mod:`hpcnb.data.cifar`.

    Raises:
        HpcnbError: The shipped registry is malformed (a packaging error).
    """
    return dict(_table("large_files"))


def _entry(name: str) -> DataFile:
    """The entry of ``name`` in the registry or, fetched only by name, its large files."""
    entry = registry().get(name) or large_files().get(name)
    if entry is None:
        known = ", ".join(sorted(registry()) + sorted(large_files()))
        raise DataNotFoundError(f"{name!r} is not in the data registry; known: {known}")
    return entry


def data_dir() -> Path | None:
    """Return the real-data folder named by ``HPCNB_DATA``, or ``None`` when unset.

    Raises:
        DataNotFoundError: ``HPCNB_DATA`` is set but is not a directory.
    """
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise DataNotFoundError(f"{ENV_VAR}={value!r} is not a directory")
    return folder


def cache_folder() -> Path:
    """Return the download cache of real data, ``<cache root>/data`` (not created)."""
    return cache_root() / "data"


_VERIFIED: dict[tuple[str, int, int], str] = {}
_READ: dict[str, str] = {}


def sha256_of(file: Path) -> str:
    """Return the sha256 hex digest of ``file`` (read in 1 MiB blocks)."""
    key = (str(file.resolve()), file.stat().st_size, file.stat().st_mtime_ns)
    if key not in _VERIFIED:
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _VERIFIED[key] = digest.hexdigest()
    return _VERIFIED[key]


def _check(entry: DataFile, file: Path) -> Path:
    actual = sha256_of(file)
    if actual != entry.sha256:
        raise ChecksumError(
            f"{file}: sha256 {actual} does not match the registry's {entry.sha256} for "
            f"{entry.name!r}; the file is not used. Replace it with the original "
            f"({entry.url}) or delete it and run '{FETCH_COMMAND} {entry.name}'"
        )
    _READ[entry.name] = entry.sha256
    _log(entry.name, entry.sha256)
    return file


def _log(name: str, state: str) -> None:
    """Append a lookup to ``$HPCNB_DATA_LOG`` when it is set (see :data:`LOG_VAR`)."""
    target = os.environ.get(LOG_VAR)
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(f"{name}\t{state}\n")


def lookup_state(name: str) -> str:
    """Return the sha256 of the local copy of a registered file, or ``"missing"``.

    Never downloads and never raises for a missing file; a corrupt copy counts as its
    actual hash (so it differs from any state logged for the real file).
    """
    entry = registry().get(name)
    if entry is None:
        return MISSING
    root = data_dir() if os.environ.get(ENV_VAR) and Path(os.environ[ENV_VAR]).is_dir() else None
    for folder in (root, cache_folder()):
        if folder is not None and (folder / name).is_file():
            return sha256_of(folder / name)
    return MISSING


def _local(entry: DataFile) -> tuple[Path | None, str]:
    """Return (verified local file or None, where it was looked for)."""
    looked = []
    root = data_dir()
    if root is not None:
        candidate = root / entry.name
        if candidate.is_file():
            return _check(entry, candidate), str(root)
        looked.append(f"{ENV_VAR}={root}")
    candidate = cache_folder() / entry.name
    if candidate.is_file():
        return _check(entry, candidate), str(cache_folder())
    looked.append(f"cache {cache_folder()}")
    return None, ", ".join(looked)


def path(name: str) -> Path:
    """Return the verified local copy of a registered file, without downloading.

    Args:
        name: Logical name (``"swf/hpc2n-seth-first3170.swf"``).

    Raises:
        DataNotFoundError: The file is neither in ``HPCNB_DATA`` nor in the cache; the
            message names the URL and the command that fetches it.
        ChecksumError: A local copy exists but its hash differs.
    """
    entry = _entry(name)
    found, looked = _local(entry)
    if found is None:
        _log(name, MISSING)
        raise DataNotFoundError(
            f"{name}: real data not found (looked in {looked}); fetch it with "
            f"'{FETCH_COMMAND} {name}' (source {entry.url}) or set {ENV_VAR} to a folder "
            "holding it"
        )
    return found


def _source_url(entry: DataFile) -> str:
    mirror = os.environ.get(MIRROR_VAR)
    return f"{mirror.rstrip('/')}/{entry.name}" if mirror else entry.url


def fetch(name: str, *, timeout: float = DEFAULT_TIMEOUT_S, progress: bool = False) -> Path:
    """Return a verified local copy of a registered file, downloading it when missing.

    Downloads go through pooch into the cache, from ``$HPCNB_DATA_MIRROR/<name>`` when
    that variable is set, else from the source URL, and are verified against the
    registry's sha256 before they are kept.

    Args:
        name: Logical name.
        timeout: Seconds allowed for connecting and for each read of the download.
        progress: Show a progress bar.

    Raises:
        DownloadError: The download failed or its checksum did not match (nothing kept).
        ChecksumError: A local copy exists but its hash differs (it is not replaced).
    """
    entry = _entry(name)
    found, _ = _local(entry)
    if found is not None:
        return found
    import pooch
    import requests

    url = _source_url(entry)
    if not progress:
        pooch.get_logger().setLevel("WARNING")
    downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)
    try:
        file = pooch.retrieve(
            url,
            known_hash=f"sha256:{entry.sha256}",
            fname=Path(entry.name).name,
            path=cache_folder() / Path(entry.name).parent,
            downloader=downloader,
            progressbar=progress,
        )
    except requests.RequestException as exc:
        raise DownloadError(f"{name}: download from {url} failed: {exc}") from exc
    except ValueError as exc:  # pooch: hash mismatch (the download is discarded)
        raise DownloadError(f"{name}: download from {url} rejected: {exc}") from exc
    return _check(entry, Path(file))


def fetch_all(
    names: Iterable[str] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: bool = False,
    on_file: Callable[[str, Path], None] | None = None,
) -> list[Path]:
    """Fetch several files, stopping at the first network failure.

    Args:
        names: Logical names (default: the whole registry).
        timeout: Per-connection timeout in seconds.
        progress: Show a progress bar per download.
        on_file: Called with ``(name, path)`` after each file is available.

    Raises:
        DownloadError: The first download that failed (later files are not tried, so
            an unreachable network costs one timeout, not one per file).
    """
    out = []
    for name in sorted(registry()) if names is None else list(names):
        file = fetch(name, timeout=timeout, progress=progress)
        out.append(file)
        if on_file is not None:
            on_file(name, file)
    return out


def available(*, large: bool = False) -> dict[str, str]:
    """Return, per registered file, where it is: ``"data folder"``, ``"cache"`` or ``"missing"``.

    A local copy whose checksum differs is reported as ``"corrupt: <path>"``.

    Args:
        large: Report the ``large_files`` table (:func:`large_files`) instead of the
            registry's files.
    """
    out = {}
    root = data_dir()
    for name, entry in sorted((large_files() if large else registry()).items()):
        where = "missing"
        for label, folder in (("data folder", root), ("cache", cache_folder())):
            if folder is not None and (folder / name).is_file():
                ok = sha256_of(folder / name) == entry.sha256
                where = label if ok else f"corrupt: {folder / name}"
                break
        out[name] = where
    return out


def verify() -> dict[str, str]:
    """Check every local copy against the registry; return ``{name: problem}`` (empty: all ok).

    Missing files are not problems; corrupt ones are.
    """
    return {name: where for name, where in available().items() if where.startswith("corrupt")}


def files_read() -> dict[str, str]:
    """Return ``{logical name: sha256}`` of every registered file used in this process."""
    return dict(_READ)


def data_path(relative: str | Path) -> Path:
    """Return a local file or folder of real data (the lookup notebooks use).

    A registered file goes through :func:`path` (verified). A folder prefix of the
    registry (``"dl"``, ``"elastisim-example"``) is returned from the first place that
    holds every registered file under it, all verified. Any other relative path is
    looked up in ``HPCNB_DATA`` only (a user's own files, not verified).

    Args:
        relative: Logical name or folder inside a data folder.

    Raises:
        DataNotFoundError: Not available locally; the message says how to fetch it.
        ChecksumError: A registered file's local copy has the wrong hash.
    """
    name = Path(relative).as_posix().strip("/")
    if name in registry():
        return path(name)
    members = [entry for key, entry in registry().items() if key.startswith(name + "/")]
    root = data_dir()
    if members:
        places = [p for p in (root, cache_folder()) if p is not None]
        for place in places:
            if all((place / m.name).is_file() for m in members):
                for member in members:
                    _check(member, place / member.name)
                return place / name
        for member in members:
            _log(member.name, lookup_state(member.name))
        raise DataNotFoundError(
            f"{name}/: real data not found complete in {' or '.join(map(str, places))} "
            f"({len(members)} registered files); fetch it with '{FETCH_COMMAND} --all' or "
            f"set {ENV_VAR} to a folder holding it"
        )
    if root is None:
        raise DataNotFoundError(
            f"{name}: not a registered data file and {ENV_VAR} is unset; "
            f"'hpcnb data list' shows the registered files"
        )
    candidate = root / name
    if not candidate.exists():
        raise DataNotFoundError(f"{candidate}: not found in {ENV_VAR}={root}")
    return candidate


def stand_in_notice(what: str, reason: str | BaseException = "") -> None:
    """Say, visibly, that a notebook uses a synthetic stand-in and how to get the real data.

    In a Jupyter kernel this displays one markdown line; elsewhere it prints it.

    Args:
        what: What stands in for which real data set (``"generated tables, stand-in for
            the Pollux step times"``).
        reason: The lookup error or message (its first line is shown).
    """
    first = str(reason).strip().splitlines()[0] if str(reason).strip() else ""
    text = (
        f"**Synthetic data ({what}).** Records computed from it are marked "
        f'`source="synthetic"` and are not tested. Get the real data with '
        f"`{FETCH_COMMAND} --all` (or set `{ENV_VAR}` to a folder holding it)."
    )
    if first:
        text += f" ({first})"
    from hpcnb.records import emit

    emit(text, {"text/markdown": text})
