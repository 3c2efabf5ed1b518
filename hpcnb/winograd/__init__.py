"""Winograd convolution from symbolic computation (reconstruction of Mazaheri et al., 2020).

Exact Cook–Toom transforms (:mod:`~hpcnb.winograd.transforms`), straight-line programs and
their optimisation (:mod:`~hpcnb.winograd.slp`, :mod:`~hpcnb.winograd.opcount`), code
generation into Numba CPU and ``numba.cuda`` kernels (:mod:`~hpcnb.winograd.codegen`,
:mod:`~hpcnb.winograd.cuda`), the convolution and its baselines
(:mod:`~hpcnb.winograd.conv`), auto-tuning with a wisdom file
(:mod:`~hpcnb.winograd.autotune`), numerics and benchmarks.
"""

from hpcnb.winograd.autotune import TuneResult, autotune, search_space
from hpcnb.winograd.bench import (
    GainMeasurement,
    Layer,
    benchmark_layer,
    geometric_mean,
    layer_set,
    measure_gain,
    round_geometric_means,
    time_configs,
)
from hpcnb.winograd.codegen import cache_dir, cpu_kernels, cpu_source, cuda_source
from hpcnb.winograd.config import WinogradConfig, default_config
from hpcnb.winograd.conv import (
    conv2d_direct,
    conv2d_im2col,
    conv2d_winograd,
    filter_transform,
    winograd_numpy,
)
from hpcnb.winograd.cuda import conv2d_winograd_cuda, validate_in_simulator
from hpcnb.winograd.numerics import direct_fp64, error_study, relative_error, winograd_reference
from hpcnb.winograd.opcount import op_count_row, op_count_table, transform_programs
from hpcnb.winograd.slp import LinearProgram, optimise
from hpcnb.winograd.transforms import (
    WinogradTransform,
    accurate_points,
    check_tensor_identity,
    cook_toom,
    default_points,
    error_bound,
    prove_equivalence,
)
from hpcnb.winograd.wisdom import (
    WisdomWarning,
    lookup_wisdom,
    read_wisdom,
    wisdom_path,
    write_wisdom,
)

__all__ = [
    "GainMeasurement",
    "Layer",
    "LinearProgram",
    "TuneResult",
    "WinogradConfig",
    "WinogradTransform",
    "WisdomWarning",
    "accurate_points",
    "autotune",
    "benchmark_layer",
    "cache_dir",
    "check_tensor_identity",
    "conv2d_direct",
    "conv2d_im2col",
    "conv2d_winograd",
    "conv2d_winograd_cuda",
    "cook_toom",
    "cpu_kernels",
    "cpu_source",
    "cuda_source",
    "default_config",
    "default_points",
    "direct_fp64",
    "error_bound",
    "error_study",
    "filter_transform",
    "geometric_mean",
    "layer_set",
    "lookup_wisdom",
    "measure_gain",
    "op_count_row",
    "op_count_table",
    "optimise",
    "prove_equivalence",
    "read_wisdom",
    "relative_error",
    "round_geometric_means",
    "search_space",
    "time_configs",
    "transform_programs",
    "validate_in_simulator",
    "winograd_numpy",
    "winograd_reference",
    "wisdom_path",
    "write_wisdom",
]
