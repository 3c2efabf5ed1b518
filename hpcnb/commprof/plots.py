"""Matplotlib figures for communication matrices and signature accuracy."""

from __future__ import annotations

import math
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from hpcnb.errors import InvalidInputError

__all__ = ["heatmap_grid", "signature_curves"]


def heatmap_grid(
    mats: Mapping[str, np.ndarray], ncols: int = 4, size: float = 2.6, unit: str = "events"
) -> Figure:
    """Draw thread×thread matrices as heat maps, one panel per entry.

    Args:
        mats: Panel title -> ``[T, T]`` matrix (writer rows, reader columns).
        ncols: Panels per row.
        size: Panel size in inches.
        unit: Colour-bar label.

    Returns:
        The figure.

    Raises:
        InvalidInputError: ``mats`` is empty.
    """
    if not mats:
        raise InvalidInputError("heatmap_grid needs at least one matrix")
    n = len(mats)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (title, m) in zip(axes.flat, mats.items(), strict=False):
        im = ax.imshow(m, cmap="viridis", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("reader thread", fontsize=8)
        ax.set_ylabel("writer thread", fontsize=8)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        cb.set_label(unit, fontsize=7)
    fig.tight_layout()
    return fig


def signature_curves(rows: list[dict[str, float | int | str]]) -> Figure:
    """F1 against signature bytes (fraction of the exact shadow) per hash and read share.

    Args:
        rows: Rows from :func:`hpcnb.commprof.shadow.signature_sweep`, possibly for several
            kernels (averaged per point), each with keys hash, fraction, read_share, f1.

    Returns:
        The figure (left: best read share per hash; right: F1 against read share).
    """
    hashes = sorted({str(r["hash"]) for r in rows})
    fracs = sorted({float(r["fraction"]) for r in rows})
    shares = sorted({float(r["read_share"]) for r in rows})

    def mean_f1(h: str, f: float, s: float) -> float:
        v = [
            float(r["f1"])
            for r in rows
            if r["hash"] == h and r["fraction"] == f and r["read_share"] == s
        ]
        return float(np.mean(v)) if v else float("nan")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    for k, h in enumerate(hashes):
        a1.plot(
            fracs,
            [max(mean_f1(h, f, s) for s in shares) for f in fracs],
            "o-",
            label=h,
            color=_colour(k, len(hashes)),
        )
    a1.axvline(1 / 8, color="grey", ls=":", label="1/8 of exact bytes")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("signature bytes / exact shadow bytes")
    a1.set_ylabel("F1 vs exact (mean over kernels)")
    a1.set_title("best read share per hash", fontsize=9)
    a1.legend(fontsize=7, loc="lower right")
    series = [(h, f) for h in hashes for f in fracs[:: max(1, len(fracs) // 3)]]
    for k, (h, f) in enumerate(series):
        a2.plot(
            shares,
            [mean_f1(h, f, s) for s in shares],
            "o-",
            label=f"{h}, {f:g}",
            color=_colour(k, len(series)),
        )
    a2.set_xlabel("share of bytes given to the read signature")
    a2.set_ylabel("F1 vs exact (mean over kernels)")
    a2.set_title("F1 against read share (hash, bytes fraction)", fontsize=9)
    a2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return fig


def _colour(k: int, n: int) -> tuple[float, float, float, float] | str:
    """Colour of series ``k`` of ``n``: the default cycle up to 10, tab20 beyond (no reuse)."""
    if n <= 10:
        return f"C{k}"
    return plt.get_cmap("tab20" if n <= 20 else "turbo")(k if n <= 20 else k / max(1, n - 1))
