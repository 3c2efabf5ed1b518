"""Embedded data sets that need no network.

scikit-learn's bundled digits and a text corpus made of the documentation strings of
modules shipped with Python.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcnb.errors import InvalidInputError

__all__ = ["DigitsSplit", "ImageSplit", "digits", "digits_folds", "kfold_splits", "text_corpus"]


@dataclass(frozen=True)
class ImageSplit:
    """An image classification data set as train / validation / test arrays.

    Images are float32 in [0, 1] with shape ``(n, channels, height, width)``; labels are
    int64.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclass(frozen=True)
class DigitsSplit(ImageSplit):
    """sklearn's 8×8 digits as train / validation / test arrays, shape ``(n, 1, 8, 8)``."""


def digits(seed: int = 0, val_fraction: float = 0.15, test_fraction: float = 0.2) -> DigitsSplit:
    """Load sklearn's bundled digits (1,797 images) and split them reproducibly.

    Args:
        seed: Seed of the shuffle.
        val_fraction: Fraction held out for validation (used by searches and agents).
        test_fraction: Fraction held out for the final test.

    Raises:
        InvalidInputError: The fractions do not leave a training set.
    """
    if not (0 <= val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise InvalidInputError(
            f"val_fraction={val_fraction}, test_fraction={test_fraction}: "
            "each must be in [0, 1) and together below 1"
        )
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test = round(len(y) * test_fraction)
    n_val = round(len(y) * val_fraction)
    return DigitsSplit(
        x_train=x[n_test + n_val :],
        y_train=y[n_test + n_val :],
        x_val=x[n_test : n_test + n_val],
        y_val=y[n_test : n_test + n_val],
        x_test=x[:n_test],
        y_test=y[:n_test],
    )


def kfold_splits(
    x: np.ndarray,
    y: np.ndarray,
    k: int = 5,
    *,
    seed: int = 0,
    val_fraction: float = 0.15,
) -> list[ImageSplit]:
    """Split a labelled set into ``k`` folds: each item is a test item of exactly one split.

    The items are shuffled once (``seed``) and cut into ``k`` folds of near-equal size.
    Split ``i`` tests on fold ``i``; the other folds are shuffled again and give its
    validation items (``val_fraction`` of them) and its training items, so nothing a
    network of split ``i`` learns from or is selected on is a test item of split ``i``.

    Args:
        x: Inputs, first axis the items.
        y: Labels, one per item.
        k: Number of folds (at least 2).
        seed: Seed of the shuffles.
        val_fraction: Fraction of the non-test items held out for validation.

    Returns:
        ``k`` :class:`ImageSplit`, split ``i`` testing on fold ``i``.

    Raises:
        InvalidInputError: ``x`` and ``y`` differ in length, ``k`` is below 2 or above the
            number of items, or ``val_fraction`` leaves no training item.

    Example:
        >>> import numpy as np
        >>> folds = kfold_splits(np.arange(10.0), np.arange(10), k=5)
        >>> sorted(int(v) for f in folds for v in f.y_test) == list(range(10))
        True
    """
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise InvalidInputError(f"kfold_splits: {len(x)} inputs but {len(y)} labels")
    if not 2 <= k <= len(y):
        raise InvalidInputError(f"kfold_splits: k={k}, expected 2 <= k <= {len(y)} items")
    if not 0 <= val_fraction < 1:
        raise InvalidInputError(f"kfold_splits: val_fraction={val_fraction}, expected [0, 1)")
    rng = np.random.default_rng(seed)
    folds = np.array_split(rng.permutation(len(y)), k)
    splits = []
    for i, test in enumerate(folds):
        rest = rng.permutation(np.concatenate([f for j, f in enumerate(folds) if j != i]))
        n_val = round(len(rest) * val_fraction)
        if n_val >= len(rest):
            raise InvalidInputError(
                f"kfold_splits: val_fraction={val_fraction} leaves no training item in fold {i}"
            )
        val, train = rest[:n_val], rest[n_val:]
        splits.append(ImageSplit(x[train], y[train], x[val], y[val], x[test], y[test]))
    return splits


def digits_folds(k: int = 5, seed: int = 0, val_fraction: float = 0.15) -> list[ImageSplit]:
    """The 1,797 digits of scikit-learn as ``k`` cross-validation splits (:func:`kfold_splits`).

    Every digit is a test item of exactly one split, so per-item results pooled over the
    splits cover the whole data set.

    Args:
        k: Number of folds.
        seed: Seed of the shuffles.
        val_fraction: Fraction of each split's non-test items held out for validation.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return kfold_splits(x, bunch.target.astype(np.int64), k, seed=seed, val_fraction=val_fraction)


_CORPUS_MODULES = (
    "argparse",
    "collections",
    "contextlib",
    "dataclasses",
    "decimal",
    "difflib",
    "email",
    "fractions",
    "functools",
    "heapq",
    "http",
    "inspect",
    "ipaddress",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "pydoc",
    "random",
    "re",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib",
    "zipfile",
)


def text_corpus(max_chars: int | None = None) -> str:
    """Return English prose from the docstrings of modules shipped with Python.

    The text is deterministic for a given Python version: the module, class and
    function docstrings of a fixed list of standard-library modules, in source order.

    Args:
        max_chars: Truncate the corpus to this many characters.
    """
    pieces: list[str] = []
    for name in _CORPUS_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    pieces.append(doc.strip())
        if max_chars is not None and sum(map(len, pieces)) >= max_chars:
            break
    text = "\n\n".join(pieces)
    return text if max_chars is None else text[:max_chars]
