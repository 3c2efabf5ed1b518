"""Numerical accuracy of Winograd convolution: fp32 and fp16 storage vs fp64 direct.

:func:`winograd_reference` evaluates the *same* optimised straight-line programs as the
generated kernels, vectorised with NumPy over all tiles and channels, in a chosen
precision. It needs no compilation, so the error of every ``F(m, r)`` and point set can be
measured quickly; the generated kernels are checked against it and against ``F.conv2d``
in the tests.
"""

from __future__ import annotations

import math

import numpy as np

from hpcnb.winograd.backend import check_conv_args
from hpcnb.winograd.conv import filter_transform
from hpcnb.winograd.opcount import transform_programs
from hpcnb.winograd.slp import LinearProgram

__all__ = ["apply_program", "direct_fp64", "error_study", "relative_error", "winograd_reference"]


def apply_program(prog: LinearProgram, X: np.ndarray, axis: int) -> np.ndarray:
    """Apply a 1-D transform program along ``axis`` of ``X`` in ``X``'s precision.

    Args:
        prog: Straight-line program with ``k`` inputs.
        X: Array whose ``axis`` has length ``k``.
        axis: Axis to transform.

    Returns:
        Array with that axis replaced by the program's outputs.
    """
    dt = X.dtype.type
    env = {name: np.take(X, i, axis=axis) for i, name in enumerate(prog.inputs)}
    for d in prog.definitions:
        total = None
        for c, terms in d.groups:
            part = None
            for s, v in terms:
                val = env[v] if s > 0 else -env[v]
                part = val if part is None else part + val
            if c != 1:
                part = dt(float(c)) * part
            total = part if total is None else total + part
        env[d.target] = total
    return np.stack([env[o] for o in prog.outputs], axis=axis)


def winograd_reference(
    x: np.ndarray,
    w: np.ndarray,
    m: int,
    padding: int = 0,
    points: str | tuple = "default",
    dtype: type = np.float32,
    storage: str = "same",
    level: str = "searched",
) -> np.ndarray:
    """Winograd convolution in NumPy with the optimised programs, in precision ``dtype``.

    Args:
        x: Input ``(N, C, H, W)``.
        w: Filters ``(K, C, r, r)``.
        m: Outputs per tile side.
        padding: Zero padding.
        points: Point set.
        dtype: Arithmetic precision (``np.float32`` or ``np.float64``).
        storage: ``"same"`` or ``"fp16"`` (transformed input and filters stored in half).
        level: Optimisation level of the programs.

    Returns:
        ``(N, K, Ho, Wo)`` in ``dtype``.
    """
    Ho, Wo = check_conv_args(x.shape, w.shape, padding)
    N, C, H, W = x.shape
    K, _, r, _ = w.shape
    progs = transform_programs(m, r, points, level)
    n = m + r - 1
    th, tw = math.ceil(Ho / m), math.ceil(Wo / m)
    xp = np.zeros((N, C, th * m + r - 1, tw * m + r - 1), dtype=dtype)
    hh, ww = min(H, xp.shape[2] - padding), min(W, xp.shape[3] - padding)
    xp[:, :, padding : padding + hh, padding : padding + ww] = x[:, :, :hh, :ww]
    win = np.lib.stride_tricks.sliding_window_view(xp, (n, n), axis=(2, 3))[:, :, ::m, ::m]
    V = apply_program(progs.input, apply_program(progs.input, win, 4), 5)  # (N,C,th,tw,n,n)
    U: np.ndarray = filter_transform(w, m, points, level).reshape(n, n, K, C).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if storage == "fp16":  # values beyond the half range become inf (reported as such)
            V = V.astype(np.float16).astype(dtype)
            U = U.astype(np.float16).astype(dtype)
        Mt = np.einsum("abkc,ncijab->nkijab", U, V, optimize=True).astype(dtype)
        Y = apply_program(progs.output, apply_program(progs.output, Mt, 4), 5)  # (N,K,th,tw,m,m)
    Y = Y.transpose(0, 1, 2, 4, 3, 5).reshape(N, K, th * m, tw * m)
    return np.ascontiguousarray(Y[:, :, :Ho, :Wo])


def direct_fp64(x: np.ndarray, w: np.ndarray, padding: int = 0) -> np.ndarray:
    """Direct convolution in float64 (``torch.nn.functional.conv2d``) as the reference.

    Args:
        x: Input ``(N, C, H, W)``.
        w: Filters ``(K, C, r, r)``.
        padding: Zero padding.
    """
    import torch
    import torch.nn.functional as F

    xt = torch.from_numpy(np.asarray(x, np.float64))
    wt = torch.from_numpy(np.asarray(w, np.float64))
    return F.conv2d(xt, wt, padding=padding).numpy()


def relative_error(y: np.ndarray, ref: np.ndarray) -> float:
    """``max |y - ref| / max |ref|``: error relative to the output's scale (inf on overflow).

    Args:
        y: The result checked.
        ref: The reference result, of the same shape.
    """
    y = np.asarray(y, np.float64)
    if not np.all(np.isfinite(y)):
        return float("inf")
    return float(np.abs(np.asarray(y, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-300))


def error_study(
    cases: tuple[tuple[int, int], ...],
    point_sets: tuple[str, ...] = ("default", "accurate"),
    shape: tuple[int, int, int, int] = (2, 16, 16, 24),
    padding: int = 1,
    seed: int = 0,
):
    """fp32 and fp16-storage error vs fp64 direct convolution for each ``F(m, r)``.

    Args:
        cases: ``(m, r)`` pairs.
        point_sets: Point sets to compare.
        shape: ``(N, C, K, H)``, square images of side ``H``.
        padding: Zero padding.
        seed: Seed of the uniform(-1, 1) data.

    Returns:
        ``pandas.DataFrame`` with columns ``F, m, r, points, fp32_error, fp16_storage_error,
        fp64_error``.
    """
    import pandas as pd

    N, C, K, H = shape
    rows = []
    rng = np.random.default_rng(seed)
    for m, r in cases:
        x = rng.uniform(-1, 1, (N, C, H, H))
        w = rng.uniform(-1, 1, (K, C, r, r))
        ref = direct_fp64(x, w, padding)
        for pts in point_sets:
            x32, w32 = x.astype(np.float32), w.astype(np.float32)
            ref32 = direct_fp64(x32, w32, padding)  # same rounded inputs
            rows.append(
                {
                    "F": f"F({m},{r})",
                    "m": m,
                    "r": r,
                    "points": pts,
                    "fp32_error": relative_error(
                        winograd_reference(x32, w32, m, padding, pts, np.float32), ref32
                    ),
                    "fp16_storage_error": relative_error(
                        winograd_reference(x32, w32, m, padding, pts, np.float32, "fp16"), ref32
                    ),
                    "fp64_error": relative_error(
                        winograd_reference(x, w, m, padding, pts, np.float64), ref
                    ),
                }
            )
    return pd.DataFrame(rows)
