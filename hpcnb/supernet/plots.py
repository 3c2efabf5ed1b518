"""Plots: how the subnets of one training step cover a shared weight matrix.

:func:`plot_coverage` draws a :class:`~hpcnb.supernet.sharing.ParameterCoverage` as the
per-element coverage counts of a weight matrix, with every subnet's leading slice
outlined from the top-left corner, so a reader sees the nested and overlapping slices
that make the join divide each element's gradient sum by its own count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from hpcnb.errors import InvalidInputError

from .sharing import ParameterCoverage

__all__ = ["plot_coverage"]

_COLOURS = ("C3", "C1", "C2", "m", "C0", "C5", "C7", "C8")
_STYLES = ("-", "--", ":", "-.")


def plot_coverage(
    coverage: ParameterCoverage, labels: Sequence[str], ax: Axes | None = None
) -> Axes:
    """Draw a weight matrix's coverage counts with each subnet's leading slice outlined.

    Each subnet gets its own colour and line style; the legend gives its kept rows x
    columns (or says that it uses no element, e.g. a skipped block). Outlines of equal
    slices are inset a little, so that they stay visible side by side.

    Args:
        coverage: Coverage of one 2-D parameter (:meth:`~hpcnb.supernet.Supernet.coverage`).
        labels: One label per subnet, in the order of ``coverage.kept``.
        ax: Axes to draw on (new figure if ``None``).

    Raises:
        InvalidInputError: The parameter is not 2-D, or the labels do not match the subnets.
    """
    counts = coverage.counts.numpy()
    if counts.ndim != 2 or len(labels) != len(coverage.kept):
        raise InvalidInputError(
            f"plot_coverage: {coverage.name} has shape {tuple(counts.shape)} (need 2-D) and "
            f"{len(coverage.kept)} subnets for {len(labels)} labels"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    n = len(coverage.kept)
    image = ax.imshow(
        counts,
        aspect="auto",
        cmap=plt.get_cmap("Blues", n + 1),
        vmin=-0.5,
        vmax=n + 0.5,
        interpolation="nearest",
    )
    drawn = 0  # outlines drawn so far: each one is inset a little more
    for i, (label, kept) in enumerate(zip(labels, coverage.kept, strict=True)):
        style: dict[str, Any] = {
            "color": _COLOURS[i % len(_COLOURS)],
            "ls": _STYLES[i % len(_STYLES)],
            "lw": 2,
        }
        if kept is None:
            ax.plot([], [], **style, label=f"{label}: no element (block skipped)")
            continue
        rows, cols = kept
        inset = 0.4 * drawn
        drawn += 1
        ax.add_patch(
            Rectangle(
                (-0.5 + inset, -0.5 + inset),
                cols - 2 * inset,
                rows - 2 * inset,
                fill=False,
                edgecolor=style["color"],
                ls=style["ls"],
                lw=style["lw"],
                label=f"{label}: {rows} rows x {cols} columns",
            )
        )
    margin = 0.02 * max(counts.shape)  # keep the outermost outline clear of the frame
    ax.set_xlim(-0.5 - margin, counts.shape[1] - 0.5 + margin)
    ax.set_ylim(counts.shape[0] - 0.5 + margin, -0.5 - margin)
    ax.set_xlabel("input feature (column index)")
    ax.set_ylabel("output feature (row index)")
    ax.set_title(f"{coverage.name} {tuple(counts.shape)}: leading slices of {n} subnets")
    ax.figure.colorbar(image, ax=ax, label="subnets using the element", ticks=range(n + 1))
    ax.legend(loc="upper left", bbox_to_anchor=(1.3, 1.0), fontsize=8)
    return ax
