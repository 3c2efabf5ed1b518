"""Data sets the notebooks share, and the ``HPCNB_DATA`` lookup for real traces.

Embedded defaults need no network: scikit-learn's bundled digits and a text corpus
made of the documentation strings of modules shipped with Python. Real traces
(SWF logs, measured deep-learning throughput, ElastiSim inputs) are not part of the
project; they are found in the folder named by the environment variable ``HPCNB_DATA``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV_VAR = "HPCNB_DATA"

__all__ = [
    "ENV_VAR",
    "DataNotFoundError",
    "DigitsSplit",
    "data_dir",
    "data_path",
    "digits",
    "text_corpus",
]


class DataNotFoundError(FileNotFoundError):
    """A data file asked for is not available (``HPCNB_DATA`` unset or file missing)."""


def data_dir() -> Path | None:
    """Return the real-data folder named by ``HPCNB_DATA``, or ``None`` when unset.

    Raises:
        DataNotFoundError: ``HPCNB_DATA`` is set but is not a directory.
    """
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataNotFoundError(f"{ENV_VAR}={value!r} is not a directory")
    return path


def data_path(relative: str | Path) -> Path:
    """Return ``$HPCNB_DATA/relative``, checking that it exists.

    Args:
        relative: Path inside the data folder, e.g. ``"swf/hpc2n-seth-first3170.swf"``.

    Raises:
        DataNotFoundError: ``HPCNB_DATA`` is unset or the file is missing; the message
            says which.
    """
    root = data_dir()
    if root is None:
        raise DataNotFoundError(
            f"{relative}: real data needs {ENV_VAR} pointing at a data folder "
            "(e.g. export HPCNB_DATA=../shared/data)"
        )
    path = root / relative
    if not path.exists():
        raise DataNotFoundError(f"{path}: not found in {ENV_VAR}={root}")
    return path


@dataclass(frozen=True)
class DigitsSplit:
    """sklearn's 8×8 digits as train / validation / test arrays.

    Images are float32 in [0, 1] with shape ``(n, 1, 8, 8)``; labels are int64.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits(seed: int = 0, val_fraction: float = 0.15, test_fraction: float = 0.2) -> DigitsSplit:
    """Load sklearn's bundled digits (1,797 images) and split them reproducibly.

    Args:
        seed: Seed of the shuffle.
        val_fraction: Fraction held out for validation (used by searches and agents).
        test_fraction: Fraction held out for the final test.

    Raises:
        ValueError: The fractions do not leave a training set.
    """
    if not (0 <= val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
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
    "argparse", "collections", "contextlib", "dataclasses", "decimal", "difflib",
    "email", "fractions", "functools", "heapq", "http", "inspect", "ipaddress", "json",
    "logging", "pathlib", "pickle", "pydoc", "random", "re", "shutil", "statistics",
    "string", "subprocess", "tarfile", "textwrap", "threading", "typing", "unittest",
    "urllib", "zipfile",
)  # fmt: skip


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
