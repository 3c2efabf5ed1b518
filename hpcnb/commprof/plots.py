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


def signature_curves(
    rows: list[dict[str, float | int | str]], by: str = "fraction", series: str = "hash"
) -> Figure:
    """F1 against the signature budget per series (hash, or design) and read share.

    Args:
        rows: Rows from :func:`hpcnb.commprof.shadow.signature_sweep` (``by="fraction"``:
            bytes as a fraction of the exact shadow's) or
            :func:`hpcnb.commprof.shadow.signature_sweep_spw` (``by="spw"``: slots per
            distinct word), possibly for several kernels (averaged per point), each with
            keys ``series``, ``by``, read_share, f1.
        by: Row column holding the budget.
        series: Row column naming a curve (``"hash"``, ``"design"`` or ``"label"``); the
            left panel shows each curve's best configuration per budget.

    Returns:
        The figure (left: best configuration per series; right: F1 against read share).
    """
    hashes = sorted({str(r[series]) for r in rows})
    fracs = sorted({float(r[by]) for r in rows})
    shares = sorted({float(r["read_share"]) for r in rows})
    configs = sorted({(str(r[series]), _rest(r, series, by)) for r in rows})

    def mean_f1(h: str, f: float, s: float | None = None, rest: str | None = None) -> float:
        v = [
            float(r["f1"])
            for r in rows
            if r[series] == h
            and r[by] == f
            and (s is None or r["read_share"] == s)
            and (rest is None or _rest(r, series, by) == rest)
        ]
        return float(np.mean(v)) if v else float("nan")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    for k, h in enumerate(hashes):
        mine = [c for hh, c in configs if hh == h]
        a1.plot(
            fracs,
            [max(mean_f1(h, f, rest=c) for c in mine) for f in fracs],
            "o-",
            label=h,
            color=_colour(k, len(hashes)),
        )
    if by == "fraction":
        a1.axvline(1 / 8, color="grey", ls=":", label="1/8 of exact bytes")
        a1.set_xlabel("signature bytes / exact shadow bytes")
    else:
        a1.axvline(1 / 4, color="grey", ls=":", label="1/4 slot per word")
        a1.set_xlabel("signature slots per distinct word")
    a1.set_xscale("log", base=2)
    a1.set_ylabel("F1 vs exact (mean over kernels)")
    a1.set_title(f"best configuration per {series}", fontsize=9)
    a1.legend(fontsize=7, loc="lower right")
    series_ = [(h, f) for h in hashes for f in fracs[:: max(1, len(fracs) // 3)]]
    for k, (h, f) in enumerate(series_):
        a2.plot(
            shares,
            [mean_f1(h, f, s) for s in shares],
            "o-",
            label=f"{h}, {f:g}",
            color=_colour(k, len(series_)),
        )
    a2.set_xlabel("share of the slots given to the read signature")
    a2.set_ylabel("F1 vs exact (mean over kernels)")
    a2.set_title(f"F1 against read share ({series}, {by})", fontsize=9)
    a2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return fig


def _rest(r: dict[str, float | int | str], series: str, by: str) -> str:
    """The row's configuration columns other than ``series``, the budget and the scores."""
    keys = ("design", "hash", "read_share", "granule", "tag_bits", "pow2")
    return repr([(k, r[k]) for k in keys if k in r and k not in (series, by)])


def _colour(k: int, n: int) -> tuple[float, float, float, float] | str:
    """Colour of series ``k`` of ``n``: the default cycle up to 10, tab20 beyond (no reuse)."""
    if n <= 10:
        return f"C{k}"
    return plt.get_cmap("tab20" if n <= 20 else "turbo")(k if n <= 20 else k / max(1, n - 1))
