"""ConvMeter-style runtime prediction: features, timing, estimators, multi-node scaling."""

from hpcnb.perfmodel.allreduce import (
    ALGORITHMS,
    AlphaBeta,
    allreduce_time,
    fit_alpha_beta,
    message_terms,
    overlapped_step,
)
from hpcnb.perfmodel.scaling import (
    ScalingDataError,
    ScalingModel,
    ScalingParams,
    ScalingTable,
    ScalingValidation,
    read_placements,
    read_scalability,
    validate_scaling,
)

__all__ = [
    "ALGORITHMS",
    "AlphaBeta",
    "ScalingDataError",
    "ScalingModel",
    "ScalingParams",
    "ScalingTable",
    "ScalingValidation",
    "allreduce_time",
    "fit_alpha_beta",
    "message_terms",
    "overlapped_step",
    "read_placements",
    "read_scalability",
    "validate_scaling",
]
