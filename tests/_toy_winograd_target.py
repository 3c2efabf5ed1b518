"""A fourth Winograd target, outside the package: NumPy running the same ``F(m, 3)`` programs.

Importing this module registers the target ``"toy_numpy"``; ``BACKEND`` is the object, so
``conv2d_winograd(x, w, target="_toy_winograd_target:BACKEND")`` (or
``"_toy_winograd_target:"``) finds it from its name alone. Its ``run`` is
:func:`hpcnb.winograd.numerics.winograd_reference`, the optimised straight-line programs of
the generated kernels evaluated with NumPy; its excerpt is the first input-transform lines
those programs render to. It has no tuning routine of its own, so it is timed at every
tile size (:func:`hpcnb.winograd.backend.sweep_tiles`).
"""

from __future__ import annotations

import numpy as np

from hpcnb.winograd import Backend, WinogradConfig, register_backend, transform_programs
from hpcnb.winograd.codegen import input_body, python_constant
from hpcnb.winograd.numerics import winograd_reference

NAME = "toy_numpy"


def run(x: np.ndarray, w: np.ndarray, padding: int, config: WinogradConfig) -> np.ndarray:
    """The same F(m, r) algorithm, vectorised over tiles in NumPy, in float32."""
    return winograd_reference(x, w, config.m, padding, config.points, np.float32)


def excerpt(m: int, r: int, lines: int) -> dict[str, str]:
    """The first lines of the input transform (Python syntax)."""
    return {
        "NumPy reference": "\n".join(input_body(transform_programs(m, r), python_constant)[:lines])
    }


BACKEND = register_backend(
    Backend(NAME, run, lambda r: WinogradConfig(m=2), label="NumPy reference", excerpt=excerpt)
)
