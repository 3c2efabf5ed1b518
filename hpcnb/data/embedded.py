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

__all__ = ["DigitsSplit", "ImageSplit", "digits", "text_corpus"]


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
