"""Tests of the CIFAR-10 reader (hpcnb.data.cifar) on tiny archives in the real format (issue 20).

The 170 MB archive itself is never downloaded here: the reader is tested on small files
written in the python-version format, and the registry entry on its shape.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from hpcnb.data import DataNotFoundError
from hpcnb.data.cifar import (
    ARCHIVE,
    CifarFormatError,
    cifar10,
    cifar10_archive,
    large_file,
    read_cifar_archive,
    write_cifar_archive,
)
from hpcnb.data.registry import ChecksumError


def test_reader_round_trips_a_tiny_archive(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = write_cifar_archive(tmp_path / "tiny.tar.gz", rng, train_per_batch=6, test=5)
    (xtr, ytr), (xte, yte) = read_cifar_archive(path)
    assert xtr.shape == (30, 3, 32, 32) and xtr.dtype == np.uint8
    assert ytr.shape == (30,) and yte.shape == (5,) and xte.shape == (5, 3, 32, 32)
    with tarfile.open(path) as archive:  # the first image is the first row, channel-major
        raw = archive.extractfile("cifar-10-batches-py/data_batch_1").read()
    first = pickle.loads(raw)[b"data"][0]
    assert np.array_equal(xtr[0, 0].ravel(), first[:1024])
    assert np.array_equal(xtr[0, 2].ravel(), first[2048:])
    split = cifar10(0, archive=path, val_fraction=0.2)
    assert len(split.y_train) == 24 and len(split.y_val) == 6 and len(split.y_test) == 5
    assert split.x_train.dtype == np.float32
    assert 0 <= split.x_train.min() <= split.x_train.max() <= 1


def test_reader_refuses_foreign_pickles_and_missing_batches(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as archive:
        raw = pickle.dumps({b"data": Path("x"), b"labels": [0]}, protocol=2)  # a foreign global
        info = tarfile.TarInfo("cifar-10-batches-py/test_batch")
        info.size = len(raw)
        archive.addfile(info, io.BytesIO(raw))
    with pytest.raises(CifarFormatError, match=r"not allowed|not a CIFAR"):
        read_cifar_archive(evil)
    partial = tmp_path / "partial.tar.gz"
    with tarfile.open(partial, "w:gz"):
        pass
    with pytest.raises(CifarFormatError, match="missing batches"):
        read_cifar_archive(partial)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar file")
    with pytest.raises(CifarFormatError):
        read_cifar_archive(junk)


def test_registered_archive_is_located_and_verified(tmp_path: Path, monkeypatch) -> None:
    entry = large_file(ARCHIVE)
    assert entry.size == 170498071 and entry.url.endswith("cifar-10-python.tar.gz")
    assert entry.sha256 == "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
    monkeypatch.setenv("HPCNB_DATA", str(tmp_path))
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataNotFoundError, match="download"):
        cifar10_archive()
    fake = tmp_path / ARCHIVE
    fake.parent.mkdir(parents=True)
    write_cifar_archive(fake, np.random.default_rng(1), train_per_batch=1, test=1)
    with pytest.raises(ChecksumError):  # a file in the right place with the wrong bytes
        cifar10_archive()
