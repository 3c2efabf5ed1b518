"""ConvMeter-style runtime estimators, the baselines, and leave-one-family-out evaluation.

**ConvMeter (our reconstruction).** The step time of a network at batch ``B`` is a
non-negative combination of its inherent costs::

    T = θ0 + θ1 K_gemm + θ2 K_other                     per-operator overheads
          + θ3 B F_dense                                 arithmetic of dense conv / linear
          + θ4 M_gemm,in + θ5 M_gemm,out                 bytes moved by conv/linear nodes
          + θ6 M_other,in + θ7 M_other,out               bytes moved by all other nodes

``K_gemm`` / ``K_other``: convolution/linear nodes and other kernel-launching nodes per
forward pass. ``F_dense``: per-sample FLOPs of dense (``groups == 1``) convolutions and
linear layers — forward FLOPs for inference, forward + backward FLOPs measured with
``FlopCounterMode`` for training. Grouped and depthwise convolutions do a handful of
multiply-adds per byte they move, so they enter through their bytes and launches, not their
FLOPs (a FLOP term for them, fitted on one family, transferred badly to another).
``M_*,in`` / ``M_*,out``: bytes read plus written at batch ``B`` by nodes whose working set
fits in / spills out of the per-core L2 cache. The SGD update has no term of its own: on
these networks it is a small part of a step, and a parameter-count term fitted on families
of similar size extrapolated badly to a family with ten times the parameters (VGG). Inference
and training share the columns. All ``θ ≥ 0`` (each is a time per unit of work), fitted by
non-negative least squares on the *relative* error (each row divided by its measured time),
so small and large configurations count alike.

**Baselines.** :class:`FlopsOnly`: ``T = θ0 + θ1 B F`` (all FLOPs, same fit).
:class:`Roofline`: ``T = max(B F / peak, bytes / bandwidth)`` with the machine's peak FLOP/s
and bandwidth from micro-benchmarks and nothing fitted.

The design matrices are built by :func:`design_matrix` from :class:`Measurement` rows.

Example:
    A ConvMeter is a scikit-learn regressor; on times that follow its model exactly it
    recovers them (here two made-up feature columns):

    >>> import numpy as np
    >>> X = np.array([[1.0, 2.0], [2.0, 1.0], [3.0, 3.0], [4.0, 1.0]])
    >>> y = 0.01 + X @ np.array([0.002, 0.001])
    >>> model = ConvMeter("inference").fit(X, y)
    >>> round(mape(model.predict(X), y), 6)
    0.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, RegressorMixin

from hpcnb.perfmodel.features import NetworkFeatures, cache_bytes_per_core
from hpcnb.perfmodel.protocol import PerfmodelError, ProtocolTiming

MODES = ("inference", "training")

__all__ = [
    "MODES",
    "ConvMeter",
    "FamilyEvaluation",
    "FlopsOnly",
    "Measurement",
    "LinearSecondsModel",
    "Roofline",
    "design_matrix",
    "feature_names",
    "leave_one_family_out",
    "mape",
    "relative_nnls",
    "measured_seconds",
    "step_time_function",
]


@dataclass(frozen=True)
class Measurement:
    """One configuration: a network's features, a batch size and its measured times.

    Attributes:
        features: Per-sample costs of the network at its input size.
        batch: Batch size.
        inference_s: Median seconds of one ``no_grad`` forward pass.
        training_s: Median seconds of one training step.
        inference_timing: The inference timing with its samples, dispersion, load and
            thread settings (:mod:`hpcnb.perfmodel.protocol`), when measured that way.
        training_timing: The same for the training step.
    """

    features: NetworkFeatures
    batch: int
    inference_s: float
    training_s: float
    inference_timing: ProtocolTiming | None = None
    training_timing: ProtocolTiming | None = None

    def timing(self, mode: str) -> ProtocolTiming | None:
        """The protocol timing of ``mode`` (``"inference"`` or ``"training"``)."""
        _check_mode(mode)
        return self.inference_timing if mode == "inference" else self.training_timing

    @property
    def family(self) -> str:
        """The architecture family."""
        return self.features.family


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise PerfmodelError(f"mode={mode!r}: expected one of {MODES}")


def _dense_flops(f: NetworkFeatures, mode: str) -> float:
    """Dense (non-grouped) FLOPs of one item: of its forward pass, or of its training step.

    Args:
        f: The network's features.
        mode: ``"inference"`` or ``"training"``.
    """
    return (
        f.conv_flops + f.linear_flops
        if mode == "inference"
        else f.train_flops - f.train_grouped_flops
    )


def _feature_matrix(
    rows: Sequence[Measurement],
    mode: str,
    cache_bytes: float | None,
    row_of: Callable[[Measurement, float], list[float]],
) -> np.ndarray:
    """Stack the feature row ``row_of(row, cache)`` of each measurement after checking ``mode``.

    Args:
        rows: Measurements.
        mode: ``"inference"`` or ``"training"``.
        cache_bytes: Per-core cache size passed on as ``cache`` (``None``: this machine's L2,
            :func:`hpcnb.perfmodel.features.cache_bytes_per_core`).
        row_of: The features of one measurement, given the cache size.

    Raises:
        PerfmodelError: Unknown mode.
    """
    _check_mode(mode)
    cache = float(cache_bytes if cache_bytes is not None else cache_bytes_per_core())
    return np.asarray([row_of(r, cache) for r in rows], dtype=float)


def feature_names(mode: str) -> list[str]:
    """Column names of :func:`design_matrix` for ``mode``.

    Args:
        mode: ``"inference"`` or ``"training"``.

    Raises:
        PerfmodelError: Unknown mode.
    """
    _check_mode(mode)
    names = [
        "gemm_kernels",
        "other_kernels",
        "dense_flops",
        "gemm_bytes_in_cache",
        "gemm_bytes_spilling",
        "other_bytes_in_cache",
        "other_bytes_spilling",
    ]
    return names


def design_matrix(
    rows: Sequence[Measurement], mode: str, cache_bytes: float | None = None
) -> np.ndarray:
    """Return the ConvMeter features of each row (columns: :func:`feature_names`).

    Args:
        rows: Measurements (only features and batch are used).
        mode: ``"inference"`` or ``"training"``.
        cache_bytes: Cache size separating resident from spilling nodes (default: this
            machine's per-core L2, :func:`hpcnb.perfmodel.features.cache_bytes_per_core`).

    Raises:
        PerfmodelError: Unknown mode.
    """

    def row(r: Measurement, cache: float) -> list[float]:
        f = r.features
        dense = float(r.batch) * _dense_flops(f, mode)
        return [f.gemm_kernels, f.kernels - f.gemm_kernels, dense, *f.split_bytes(r.batch, cache)]

    return _feature_matrix(rows, mode, cache_bytes, row)


def measured_seconds(rows: Sequence[Measurement], mode: str) -> np.ndarray:
    """Return the measured seconds of each row for ``mode``.

    Args:
        rows: Measurements.
        mode: ``"inference"`` (the ``no_grad`` forward pass) or ``"training"`` (one step).

    Raises:
        PerfmodelError: Unknown mode.
    """
    _check_mode(mode)
    return np.array([r.inference_s if mode == "inference" else r.training_s for r in rows])


def mape(predicted: ArrayLike, measured: ArrayLike) -> float:
    """Mean absolute percentage error, as a fraction (0.1 = 10 %).

    The interval of a MAPE is :func:`hpcnb.stats.mape_interval`.

    Args:
        predicted: Predicted values.
        measured: Measured values (positive), as many as ``predicted``.
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(p - m) / m))


def relative_nnls(
    X: np.ndarray, y: np.ndarray, offset: np.ndarray | float = 0.0
) -> tuple[float, np.ndarray]:
    """``θ0, θ ≥ 0`` minimising ``Σ ((offset + θ0 + X θ - y) / y)²``.

    Args:
        X: Features ``(n, k)``.
        y: Measured seconds ``(n,)``, finite and positive.
        offset: A fixed part of every prediction (scalar or ``(n,)``), not fitted.

    Returns:
        ``(θ0, θ)``: the intercept and the ``k`` coefficients.

    Raises:
        PerfmodelError: Mismatched shapes, no rows, or a time that is not finite and positive.
    """
    from scipy.optimize import nnls

    if X.ndim != 2 or len(X) != len(y):
        raise PerfmodelError(f"X has shape {X.shape}, y has {len(y)} entries; expected (n, k), n")
    if len(y) == 0 or np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise PerfmodelError("targets must be a non-empty set of finite positive times")
    scale = np.maximum(np.abs(X).max(axis=0), 1e-300)  # column scaling for conditioning
    A = np.column_stack([np.ones(len(y)), X / scale]) / y[:, None]
    coef, _ = nnls(A, 1.0 - np.asarray(offset) / y, maxiter=50 * A.shape[1])
    return float(coef[0]), coef[1:] / scale


class LinearSecondsModel(RegressorMixin, BaseEstimator):
    """Base of the fitted non-negative linear runtime models: ``intercept_ + X @ coef_``.

    Subclasses fit ``intercept_``, ``coef_`` and ``n_features_in_``.
    """

    intercept_: float
    coef_: np.ndarray
    n_features_in_: int

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted seconds, shape ``(n,)``.

        Raises:
            PerfmodelError: Wrong number of feature columns (a ``ValueError``).
        """
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise PerfmodelError(f"X has shape {X.shape}; expected (n, {self.n_features_in_})")
        return self.intercept_ + X @ self.coef_


class ConvMeter(LinearSecondsModel):
    """Non-negative linear runtime model over ConvMeter features (module docstring).

    Args:
        mode: ``"inference"`` or ``"training"`` (only used to name the columns).
    """

    def __init__(self, mode: str = "inference") -> None:
        self.mode = mode

    def fit(self, X: ArrayLike, y: ArrayLike) -> ConvMeter:
        """Fit ``θ ≥ 0`` minimising the squared relative error.

        Args:
            X: Features, shape ``(n, k)`` (from :func:`design_matrix`).
            y: Measured seconds, shape ``(n,)``.

        Returns:
            ``self`` with ``intercept_`` (θ0) and ``coef_`` (θ1..θk).
        """
        _check_mode(self.mode)
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        self.intercept_, self.coef_ = relative_nnls(X, y)
        self.n_features_in_ = X.shape[1]
        return self

    def formula(self) -> str:
        """The fitted formula as text, with each term's unit cost."""
        names = feature_names(self.mode)
        terms = [f"{self.intercept_:.3g} s"]
        terms += [f"{c:.3g}·{n}" for c, n in zip(self.coef_, names, strict=False) if c > 0]
        return "T = " + " + ".join(terms)


class FlopsOnly(RegressorMixin, BaseEstimator):
    """Baseline ``T = θ0 + θ1 · FLOPs`` fitted like :class:`ConvMeter`.

    ``X`` is the one-column total FLOPs of each row (see :meth:`flops_column`).
    """

    def fit(self, X: ArrayLike, y: ArrayLike) -> FlopsOnly:
        """Fit the line by relative non-negative least squares; return ``self``.

        Args:
            X: Total FLOPs of each row, ``(n,)`` or ``(n, 1)`` (:meth:`flops_column`).
            y: Measured seconds ``(n,)``.
        """
        X = np.asarray(X, dtype=float).reshape(len(np.asarray(y)), -1)
        self.intercept_, self.coef_ = relative_nnls(X, np.asarray(y, dtype=float))
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted seconds."""
        X = np.asarray(X, dtype=float).reshape(-1, self.n_features_in_)
        return self.intercept_ + X @ self.coef_

    @staticmethod
    def flops_column(rows: Sequence[Measurement], mode: str) -> np.ndarray:
        """Total FLOPs of each row (forward for inference, measured training FLOPs).

        Args:
            rows: Measurements (features and batch are used).
            mode: ``"inference"`` or ``"training"``.

        Returns:
            The column ``(n, 1)``.
        """
        _check_mode(mode)
        per = [
            r.features.forward_flops if mode == "inference" else r.features.train_flops
            for r in rows
        ]
        return (np.array(per) * np.array([r.batch for r in rows]))[:, None]


class Roofline:
    """Roofline baseline: ``T = max(FLOPs / peak, bytes / bandwidth)``, nothing fitted.

    Training moves roughly three times the forward bytes (forward, input gradient, weight
    gradient) plus 16 bytes per parameter (read weight, gradient and momentum, write two).

    Args:
        peak_flops: Measured FLOP/s.
        bandwidth: Measured bytes/s.
        mode: ``"inference"`` or ``"training"``.

    Raises:
        PerfmodelError: Unknown mode, or a rate that is not positive.
    """

    def __init__(self, peak_flops: float, bandwidth: float, mode: str = "inference") -> None:
        _check_mode(mode)
        if peak_flops <= 0 or bandwidth <= 0:
            raise PerfmodelError(f"peak_flops={peak_flops}, bandwidth={bandwidth}: expected > 0")
        self.peak_flops = peak_flops
        self.bandwidth = bandwidth
        self.mode = mode

    def predict_rows(self, rows: Sequence[Measurement]) -> np.ndarray:
        """Predicted seconds of each row."""
        out = []
        for r in rows:
            f, b = r.features, r.batch
            if self.mode == "inference":
                flops, nbytes = b * f.forward_flops, b * f.memory_bytes + 4 * f.params
            else:
                flops, nbytes = b * f.train_flops, 3 * b * f.memory_bytes + 16 * f.params
            out.append(max(flops / self.peak_flops, nbytes / self.bandwidth))
        return np.array(out)


@dataclass(frozen=True)
class FamilyEvaluation:
    """Leave-one-family-out predictions.

    Attributes:
        predicted: Held-out prediction of every row (from a model fitted without its family).
        measured: Measured seconds of every row.
        families: Family of every row.
        per_family: MAPE of each held-out family.
        mape: MAPE over all rows.
    """

    predicted: np.ndarray
    measured: np.ndarray
    families: tuple[str, ...]
    per_family: dict[str, float]
    mape: float


def leave_one_family_out(
    make: Callable[[], BaseEstimator],
    X: ArrayLike,
    y: ArrayLike,
    families: Sequence[str],
) -> FamilyEvaluation:
    """Fit on all families but one, predict that one, for every family.

    Args:
        make: Returns a fresh unfitted estimator with ``fit``/``predict``.
        X: Features ``(n, k)``.
        y: Measured seconds ``(n,)``.
        families: Family of each row.

    Raises:
        PerfmodelError: Fewer than two families or mismatched lengths.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    fam = np.asarray(families)
    if not (len(X) == len(y) == len(fam)):
        raise PerfmodelError(f"X, y, families have lengths {len(X)}, {len(y)}, {len(fam)}")
    names = list(dict.fromkeys(fam.tolist()))
    if len(names) < 2:
        raise PerfmodelError(f"need at least two families to hold one out, got {names}")
    pred = np.empty_like(y)
    per: dict[str, float] = {}
    for name in names:
        held = fam == name
        model = make().fit(X[~held], y[~held])
        pred[held] = model.predict(X[held])
        per[name] = mape(pred[held], y[held])
    return FamilyEvaluation(pred, y, tuple(fam.tolist()), per, mape(pred, y))


def step_time_function(
    model: ConvMeter, features: NetworkFeatures, cache_bytes: float | None = None
) -> Callable[[int], float]:
    """Return ``batch -> predicted seconds`` of a fitted ConvMeter for one network.

    Useful as the compute model of :func:`hpcnb.perfmodel.multinode.runtime_vs_nodes`.

    Args:
        model: A fitted :class:`ConvMeter` (its ``mode`` selects inference or training).
        features: The network's features.
        cache_bytes: Cache size used when the model was fitted (default: this machine's).
    """

    def predict(batch: int) -> float:
        row = Measurement(features, int(batch), float("nan"), float("nan"))
        return float(model.predict(design_matrix([row], model.mode, cache_bytes))[0])

    return predict
