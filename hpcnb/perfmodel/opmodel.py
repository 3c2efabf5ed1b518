"""A per-op-kind single-node runtime model, and a gradient-boosted upper reference.

**OpCostModel (our own design, a reconstruction in ConvMeter's spirit).** A step's time is a
non-negative sum of what each *group* of operators costs, read from the IR
(:data:`hpcnb.perfmodel.features.OP_GROUPS`: dense convolutions and linear layers,
grouped/depthwise convolutions, normalisations, activations, pooling, element-wise ops)::

    T = θ0 + Σ_g ( λ_g K_g  +  μ_g B M_g ) + φ_dense B F_dense + φ_grouped B F_grouped
           + σ B M_spill                                   (bytes of nodes beyond the cache)
           [ + ρ K_param + α B A ]                         (training only)

``K_g``: kernel launches of group ``g`` per forward pass; ``M_g``: its bytes read plus
written per sample; ``F``: FLOPs per sample of dense and of grouped convolutions (forward for
inference, forward + backward, measured, for training); ``M_spill``: bytes of nodes whose
working set at batch ``B`` exceeds the per-core L2 cache (an *excess* term, so the prediction
never falls when a network grows); ``K_param``: parameter tensors (one optimizer update
each); ``A``: activation memory per sample (what back-propagation keeps and reads again).
Every coefficient is a time per unit of work, so all are ``≥ 0`` and the fitted model reads
as a price list (:meth:`OpCostModel.formula`). Fitted by non-negative least squares on the
relative error, like :class:`hpcnb.perfmodel.estimator.ConvMeter`.

Because every feature grows (weakly) with a network's width and every coefficient is
non-negative, the prediction is monotone in width: a pruned network is never predicted
slower than its parent.

**BoostedReference.** A scikit-learn ``GradientBoostingRegressor`` on the logarithm of the
same features, predicting the logarithm of the time: a flexible model with no structure,
shown as the reference of how much the small model gives up (on held-out *families* trees
cannot extrapolate, so it is not an upper bound there).

Example:
    >>> import numpy as np
    >>> X = np.array([[1.0, 2.0], [2.0, 1.0], [3.0, 3.0], [4.0, 1.0]])
    >>> y = 0.01 + X @ np.array([0.002, 0.001])
    >>> model = OpCostModel("inference").fit(X, y)
    >>> bool(np.allclose(model.predict(X), y))
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, RegressorMixin

from hpcnb.perfmodel.estimator import (
    LinearSecondsModel,
    Measurement,
    _check_mode,
    _dense_flops,
    _feature_matrix,
    relative_nnls,
)
from hpcnb.perfmodel.features import OP_GROUPS
from hpcnb.perfmodel.protocol import PerfmodelError

__all__ = ["BoostedReference", "OpCostModel", "op_design_matrix", "op_feature_names"]


def op_feature_names(mode: str) -> list[str]:
    """Column names of :func:`op_design_matrix` for ``mode``."""
    _check_mode(mode)
    names = [f"launches_{g}" for g in OP_GROUPS]
    names += [f"bytes_{g}" for g in OP_GROUPS]
    names += ["flops_dense", "flops_grouped", "bytes_spill"]
    if mode == "training":
        names += ["param_tensors", "activation_bytes"]
    return names


def op_design_matrix(
    rows: Sequence[Measurement], mode: str, cache_bytes: float | None = None
) -> np.ndarray:
    """The per-op-kind features of each row (columns: :func:`op_feature_names`).

    Per op group the kernel launches and the bytes moved, then the dense and the grouped
    convolution FLOPs and the bytes of the nodes that spill the cache; in training also
    the parameter tensors and the activation bytes.

    Args:
        rows: Measurements (only features and batch are used).
        mode: ``"inference"`` or ``"training"``.
        cache_bytes: Per-core cache size (default: this machine's L2).

    Raises:
        PerfmodelError: Unknown mode, or features without op-group costs (computed by an
            older :func:`~hpcnb.perfmodel.features.network_features`), or training
            features without measured training FLOPs.
    """

    def row(r: Measurement, cache: float) -> list[float]:
        f, b = r.features, float(r.batch)
        if not f.group_costs:
            raise PerfmodelError(f"{f.name or 'features'}: no op-group costs; recompute them")
        groups = [f.group_costs.get(g, (0.0, 0.0, 0.0)) for g in OP_GROUPS]
        launches = [g[0] for g in groups]
        moved = [b * g[2] for g in groups]
        if mode == "training" and f.train_flops <= 0:
            raise PerfmodelError(f"{f.name or 'features'}: training FLOPs were not measured")
        grouped = f.grouped_conv_flops if mode == "inference" else f.train_grouped_flops
        spill = sum(max(0.0, b * nb - cache) for nb in (*f.gemm_node_bytes, *f.other_node_bytes))
        out = [*launches, *moved, b * _dense_flops(f, mode), b * grouped, spill]
        if mode == "training":
            out += [float(f.param_tensors), b * f.activation_bytes]
        return out

    return _feature_matrix(rows, mode, cache_bytes, row)


class OpCostModel(LinearSecondsModel):
    """Non-negative per-op-kind runtime model (module docstring).

    With ``peak_flops`` (the machine's measured matrix-product rate,
    :func:`hpcnb.perfmodel.timing.peak_flops`) the dense-FLOP coefficient is bounded below by
    ``1 / peak_flops``: no FLOP costs less than at peak. Without that floor the coefficient
    is identified only by the families in the fit, and when they spend their time on
    launches and memory traffic it comes out near zero, so a compute-bound family held out
    (VGG) is predicted several times too fast.

    Args:
        mode: ``"inference"`` or ``"training"`` (names the columns in :meth:`formula`).
        peak_flops: Measured FLOP/s of this machine (``None``: no floor).
    """

    def __init__(self, mode: str = "inference", peak_flops: float | None = None) -> None:
        self.mode = mode
        self.peak_flops = peak_flops

    def fit(self, X: ArrayLike, y: ArrayLike) -> OpCostModel:
        """Fit ``θ ≥ 0`` (dense FLOPs ``≥ 1/peak``) minimising the squared relative error.

        Args:
            X: Features ``(n, k)`` from :func:`op_design_matrix`.
            y: Measured seconds ``(n,)``.

        Returns:
            ``self`` with ``intercept_`` and ``coef_``.
        """
        _check_mode(self.mode)
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        floor = np.zeros(X.shape[1]) if X.ndim == 2 else np.zeros(0)
        names = op_feature_names(self.mode)
        if self.peak_flops is not None:
            if not self.peak_flops > 0:
                raise PerfmodelError(f"OpCostModel: peak_flops={self.peak_flops}, expected > 0")
            if X.ndim != 2 or X.shape[1] != len(names):
                raise PerfmodelError(
                    f"OpCostModel(peak_flops=...): X has shape {X.shape}, expected the "
                    f"{len(names)} columns of op_design_matrix"
                )
            floor[names.index("flops_dense")] = 1.0 / self.peak_flops
        base = X @ floor if X.ndim == 2 else 0.0
        # minimise Σ ((base + θ0 + Xθ - y) / y)² with θ ≥ 0: fit the extra over the floor
        # as a relative NNLS on targets y - base, weighted by the original y.
        self.intercept_, extra = relative_nnls(X, y, offset=base)
        self.coef_ = floor + extra
        self.n_features_in_ = X.shape[1]
        return self

    def formula(self) -> str:
        """The fitted price list: each non-zero term with its unit cost."""
        names = op_feature_names(self.mode)
        if len(names) != len(self.coef_):
            names = [f"x{i}" for i in range(len(self.coef_))]
        terms = [f"{self.intercept_:.3g} s"]
        terms += [f"{c:.3g}·{n}" for c, n in zip(self.coef_, names, strict=True) if c > 0]
        return "T = " + " + ".join(terms)


class BoostedReference(RegressorMixin, BaseEstimator):
    """Gradient-boosted trees on ``log1p`` of the features, predicting ``log`` seconds.

    Args:
        n_estimators: Boosting stages.
        max_depth: Depth of each tree.
        learning_rate: Shrinkage.
        seed: Random state of the trees (subsampling).
    """

    def __init__(
        self,
        n_estimators: int = 300,
        max_depth: int = 3,
        learning_rate: float = 0.05,
        seed: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.seed = seed

    def fit(self, X: ArrayLike, y: ArrayLike) -> BoostedReference:
        """Fit the trees on ``log1p(X)`` → ``log(y)``; return ``self``.

        Args:
            X: Features ``(n, k)`` (negative values are clipped to 0).
            y: Measured seconds ``(n,)``.

        Raises:
            PerfmodelError: Non-positive or non-finite times.
        """
        from sklearn.ensemble import GradientBoostingRegressor

        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if len(y) == 0 or np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise PerfmodelError("BoostedReference: times must be finite and positive")
        self.model_ = GradientBoostingRegressor(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            subsample=0.8,
            random_state=self.seed,
        ).fit(np.log1p(np.maximum(X, 0.0)), np.log(y))
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted seconds ``(n,)``."""
        X = np.asarray(X, dtype=float)
        return np.exp(self.model_.predict(np.log1p(np.maximum(X, 0.0))))
