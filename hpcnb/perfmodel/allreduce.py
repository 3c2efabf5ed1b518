"""The α–β (latency–bandwidth) cost model of all-reduce, and how it overlaps with compute.

An all-reduce of ``n`` bytes over ``p`` ranks costs, in the Hockney model with a per-message
latency ``α`` (seconds) and an inverse bandwidth ``β`` (seconds per byte):

* **ring** (reduce-scatter then all-gather, 2(p−1) steps of n/p bytes each)::

      T_ring(p, n) = 2 (p − 1) α + 2 (p − 1) / p · n β

* **tree** (binary-tree reduce then broadcast, whole message at every level)::

      T_tree(p, n) = 2 ⌈log2 p⌉ (α + n β)

Both are zero for ``p = 1``. Compute and communication of one data-parallel training step
overlap partly (gradient buckets are reduced while back-propagation goes on). The *overlap
factor* ``ω ∈ [0, 1]`` says how much of the shorter of the two is hidden::

      T_step = T_compute + T_comm − ω · min(T_compute, T_comm)

``ω = 0`` is no overlap (the sum), ``ω = 1`` perfect overlap (the maximum).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from hpcnb.perfmodel.protocol import PerfmodelError

ALGORITHMS = ("ring", "tree")

__all__ = [
    "ALGORITHMS",
    "AlphaBeta",
    "allreduce_time",
    "fit_alpha_beta",
    "message_terms",
    "overlapped_step",
]


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise PerfmodelError(f"algorithm={algorithm!r}: expected one of {ALGORITHMS}")


def message_terms(p: ArrayLike, algorithm: str = "ring") -> tuple[np.ndarray, np.ndarray]:
    """Return the multipliers of ``α`` and of ``n β`` in the all-reduce time.

    ``T = a(p) α + b(p) n β``; for the ring ``a = 2(p−1)``, ``b = 2(p−1)/p``; for the tree
    ``a = b = 2⌈log2 p⌉``. Both are zero for ``p ≤ 1``.

    Args:
        p: Number of ranks (scalar or array, ≥ 1).
        algorithm: ``"ring"`` or ``"tree"``.

    Raises:
        PerfmodelError: Unknown algorithm or a rank count below 1.
    """
    _check_algorithm(algorithm)
    p = np.asarray(p, dtype=float)
    if np.any(p < 1):
        raise PerfmodelError(f"number of ranks p must be >= 1, got min {p.min()}")
    if algorithm == "ring":
        a = 2.0 * (p - 1.0)
        b = np.where(p > 1, 2.0 * (p - 1.0) / p, 0.0)
    else:
        steps = 2.0 * np.ceil(np.log2(np.maximum(p, 1.0)))
        a, b = steps, steps
    return a, b


def allreduce_time(
    p: ArrayLike, nbytes: ArrayLike, alpha: float, beta: float, algorithm: str = "ring"
) -> np.ndarray:
    """Predict the time of one all-reduce in the α–β model.

    Args:
        p: Number of ranks.
        nbytes: Message size in bytes.
        alpha: Latency per message step, seconds.
        beta: Inverse bandwidth, seconds per byte.
        algorithm: ``"ring"`` or ``"tree"``.

    Returns:
        Seconds, broadcast over ``p`` and ``nbytes``.

    Raises:
        PerfmodelError: Unknown algorithm or a rank count below 1.
    """
    a, b = message_terms(p, algorithm)
    return a * alpha + b * np.asarray(nbytes, dtype=float) * beta


def overlapped_step(t_compute: ArrayLike, t_comm: ArrayLike, overlap: float) -> np.ndarray:
    """Combine compute and communication time with an overlap factor.

    Args:
        t_compute: Compute time of one step (forward, backward, optimiser), seconds.
        t_comm: Gradient all-reduce time, seconds.
        overlap: ``ω`` in [0, 1]: 0 adds the two, 1 takes the maximum.

    Raises:
        PerfmodelError: ``overlap`` outside [0, 1].
    """
    if not 0.0 <= overlap <= 1.0:
        raise PerfmodelError(f"overlap={overlap}: expected a factor in [0, 1]")
    tc = np.asarray(t_compute, dtype=float)
    ta = np.asarray(t_comm, dtype=float)
    return tc + ta - overlap * np.minimum(tc, ta)


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted latency and inverse bandwidth of an all-reduce.

    Attributes:
        alpha: Seconds per message step.
        beta: Seconds per byte.
        algorithm: The collective algorithm the fit assumed.
        mape: Mean absolute percentage error of the fit on its own samples.
    """

    alpha: float
    beta: float
    algorithm: str = "ring"
    mape: float = float("nan")

    @property
    def bandwidth(self) -> float:
        """Effective bandwidth ``1/β`` in bytes per second."""
        return 1.0 / self.beta if self.beta > 0 else float("inf")

    def time(self, p: ArrayLike, nbytes: ArrayLike) -> np.ndarray:
        """Predict the all-reduce time of ``nbytes`` over ``p`` ranks, seconds.

        Args:
            p: Number of ranks (scalar or array, ≥ 1).
            nbytes: Message size in bytes.
        """
        return allreduce_time(p, nbytes, self.alpha, self.beta, self.algorithm)


def fit_alpha_beta(
    p: ArrayLike, nbytes: ArrayLike, seconds: ArrayLike, algorithm: str = "ring"
) -> AlphaBeta:
    """Fit ``α`` and ``β`` to measured all-reduce times by relative non-negative least squares.

    Each sample is weighted by ``1/seconds`` so that small messages (latency-bound) count as
    much as large ones (bandwidth-bound).

    Args:
        p: Ranks of each sample (all > 1).
        nbytes: Message size of each sample, bytes.
        seconds: Measured time of each sample.
        algorithm: ``"ring"`` or ``"tree"``.

    Raises:
        PerfmodelError: Mismatched lengths, fewer than two samples, ``p = 1`` samples, or
            non-positive times.
    """
    from scipy.optimize import nnls

    p = np.asarray(p, dtype=float).ravel()
    n = np.asarray(nbytes, dtype=float).ravel()
    t = np.asarray(seconds, dtype=float).ravel()
    if not (len(p) == len(n) == len(t)):
        raise PerfmodelError(f"p, nbytes, seconds have lengths {len(p)}, {len(n)}, {len(t)}")
    if len(t) < 2:
        raise PerfmodelError(f"need at least two samples to fit alpha and beta, got {len(t)}")
    if np.any(p <= 1):
        raise PerfmodelError("samples with p <= 1 carry no communication; remove them")
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise PerfmodelError("measured times must be finite and positive")
    a, b = message_terms(p, algorithm)
    design = np.column_stack([a, b * n]) / t[:, None]
    coef, _ = nnls(design, np.ones_like(t))
    alpha, beta = float(coef[0]), float(coef[1])
    pred = allreduce_time(p, n, alpha, beta, algorithm)
    return AlphaBeta(alpha, beta, algorithm, float(np.mean(np.abs(pred - t) / t)))
