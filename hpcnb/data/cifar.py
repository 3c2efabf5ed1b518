"""CIFAR-10 (the python-version archive): located, verified, read without arbitrary pickle globals.

The canonical archive ``cifar-10-python.tar.gz`` (170 MB) is registered in
``registry.toml`` under ``large_files`` with its sha256: too large for the offline test
copy, it is fetched only when asked (:func:`cifar10_archive` with ``download=True``). The
lookup is the registry's: the ``HPCNB_DATA`` folder, then the cache, then a verified
download with pooch (from ``$HPCNB_DATA_MIRROR`` when set).

Each batch inside the archive is a pickled dict (``b"data"``: a ``uint8`` array of shape
``(n, 3072)``, channel-major 32×32 images; ``b"labels"``: a list of ints). Batches are read
with a restricted unpickler that rebuilds only NumPy arrays and plain containers and
refuses every other global, so a tampered file cannot run code; member sizes and counts
are bounded.

Example: a tiny archive in the same format (:func:`write_cifar_archive`) read back:

    >>> import tempfile, numpy as np
    >>> from pathlib import Path
    >>> from hpcnb.data.cifar import read_cifar_archive, write_cifar_archive
    >>> rng = np.random.default_rng(0)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = write_cifar_archive(Path(tmp) / "tiny.tar.gz", rng, train_per_batch=4, test=3)
    ...     (xtr, ytr), (xte, yte) = read_cifar_archive(path)
    >>> xtr.shape, xtr.dtype, yte.shape
    ((20, 3, 32, 32), dtype('uint8'), (3,))
"""

from __future__ import annotations

import io
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcnb.data.embedded import ImageSplit
from hpcnb.data.registry import (
    DEFAULT_TIMEOUT_S,
    DataFile,
    DataNotFoundError,
    fetch,
    large_files,
    path,
)
from hpcnb.errors import HpcnbError, InvalidInputError

__all__ = [
    "ARCHIVE",
    "CifarFormatError",
    "CifarSplit",
    "cifar10",
    "cifar10_archive",
    "large_file",
    "read_cifar_archive",
    "write_cifar_archive",
]

ARCHIVE = "cifar10/cifar-10-python.tar.gz"
"""Logical name of the canonical archive in the registry's ``large_files`` table."""

MAX_MEMBER_BYTES = 40_000_000
"""Largest batch file read from an archive (a real batch is about 31 MB)."""

MAX_MEMBERS = 64
"""Most members an archive may have."""

_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST = "test_batch"
_FOLDER = "cifar-10-batches-py"


class CifarFormatError(HpcnbError, ValueError):
    """A CIFAR archive or batch that is not in the python-version format (names the member)."""


def large_file(name: str = ARCHIVE) -> DataFile:
    """Return the registry entry of a large file (the ``large_files`` table).

    Raises:
        DataNotFoundError: ``name`` is not registered there.
    """
    table = large_files()
    if name not in table:
        raise DataNotFoundError(
            f"{name!r} is not in the registry's large_files; known: {sorted(table)}"
        )
    return table[name]


def cifar10_archive(*, download: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> Path:
    """Return the verified CIFAR-10 archive: ``HPCNB_DATA``, the cache, or a download.

    Args:
        download: Download it (170 MB) when it is in neither folder.
        timeout: Seconds allowed for connecting and for each read of the download.

    Raises:
        DataNotFoundError: Not found locally and ``download`` is false.
        ChecksumError: A local copy whose hash differs (never used, never replaced).
        DownloadError: The download failed or did not verify.
    """
    if download:
        return fetch(ARCHIVE, timeout=timeout)
    try:
        return path(ARCHIVE)
    except DataNotFoundError as exc:
        size_mb = large_file(ARCHIVE).size / 1e6
        raise DataNotFoundError(
            f"{exc}; or download it ({size_mb:.0f} MB) with cifar10(download=True)"
        ) from None


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("_codecs", "encode"),  # bytes pickled by Python 3 at protocol 2
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays only; every other global is refused."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")


def _read_batch(raw: bytes, member: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CifarFormatError(f"{member}: not a CIFAR python batch ({exc})") from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise CifarFormatError(f"{member}: expected a dict with b'data' and b'labels'")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise CifarFormatError(
            f"{member}: data of dtype {data.dtype} and shape {data.shape}, expected uint8 (n, 3072)"
        )
    if labels.shape != (data.shape[0],) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise CifarFormatError(
            f"{member}: {labels.shape} labels in [0, 9] expected for {data.shape[0]} images"
        )
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar_archive(
    path: str | Path,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Read the five training batches and the test batch of a python-version archive.

    Args:
        path: The ``.tar.gz`` archive.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``: ``uint8`` images ``(n, 3, 32, 32)`` and
        ``int64`` labels.

    Raises:
        CifarFormatError: A missing batch, an oversized or malformed member, too many members.
    """
    path = Path(path)
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for count, info in enumerate(archive):
                if count >= MAX_MEMBERS:
                    raise CifarFormatError(f"{path}: more than {MAX_MEMBERS} members")
                name = Path(info.name).name
                if not info.isfile() or name not in (*_TRAIN, _TEST):
                    continue
                if info.size > MAX_MEMBER_BYTES:
                    raise CifarFormatError(
                        f"{path}:{info.name}: {info.size} bytes, over {MAX_MEMBER_BYTES}"
                    )
                handle = archive.extractfile(info)
                if handle is None:
                    continue
                found[name] = _read_batch(handle.read(), f"{path}:{info.name}")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise CifarFormatError(f"{path}: not a readable .tar.gz archive ({exc})") from exc
    missing = [n for n in (*_TRAIN, _TEST) if n not in found]
    if missing:
        raise CifarFormatError(f"{path}: missing batches {missing}")
    x_train = np.concatenate([found[n][0] for n in _TRAIN])
    y_train = np.concatenate([found[n][1] for n in _TRAIN])
    return (x_train, y_train), found[_TEST]


def write_cifar_archive(
    path: str | Path, rng: np.random.Generator, *, train_per_batch: int = 10, test: int = 10
) -> Path:
    """Write a small archive in the python-version format (random images; for tests).

    Args:
        path: Where to write the ``.tar.gz``.
        rng: Source of the random images and labels.
        train_per_batch: Images in each of the five training batches.
        test: Images in the test batch.
    """
    path = Path(path)
    with tarfile.open(path, "w:gz") as archive:
        for name, n in [*((b, train_per_batch) for b in _TRAIN), (_TEST, test)]:
            batch = {
                b"batch_label": name.encode(),
                b"labels": [int(v) for v in rng.integers(0, 10, n)],
                b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                b"filenames": [f"{name}_{i}.png".encode() for i in range(n)],
            }
            raw = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"{_FOLDER}/{name}")
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    return path


@dataclass(frozen=True)
class CifarSplit(ImageSplit):
    """CIFAR-10 as train / validation / test arrays (like :class:`hpcnb.data.DigitsSplit`).

    Images are float32 in [0, 1] with shape ``(n, 3, 32, 32)``; labels are int64.
    """


def cifar10(
    seed: int = 0,
    *,
    train: int | None = None,
    test: int | None = None,
    val_fraction: float = 0.15,
    archive: str | Path | None = None,
    download: bool = False,
) -> CifarSplit:
    """Load CIFAR-10 and split it reproducibly (validation taken from the training set).

    Args:
        seed: Seed of the shuffle and of the subsets.
        train: Training + validation images to keep (default all 50,000).
        test: Test images to keep (default all 10,000).
        val_fraction: Fraction of the kept training images held out for validation.
        archive: An archive to read instead of the registered one (e.g. a test file).
        download: Download the registered archive when it is not found locally.

    Raises:
        InvalidInputError: ``val_fraction`` is not in [0, 1).
        DataNotFoundError: The archive is not available and ``download`` is false.
        CifarFormatError: The archive is malformed.
    """
    if not 0 <= val_fraction < 1:
        raise InvalidInputError(f"cifar10: val_fraction={val_fraction}, expected in [0, 1)")
    source = Path(archive) if archive is not None else cifar10_archive(download=download)
    (xtr, ytr), (xte, yte) = read_cifar_archive(source)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ytr))[: train or len(ytr)]
    test_order = rng.permutation(len(yte))[: test or len(yte)]
    n_val = round(val_fraction * len(order))
    val, tr = order[:n_val], order[n_val:]

    def scale(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / 255.0).copy()

    return CifarSplit(
        x_train=scale(xtr[tr]),
        y_train=ytr[tr],
        x_val=scale(xtr[val]),
        y_val=ytr[val],
        x_test=scale(xte[test_order]),
        y_test=yte[test_order],
    )
