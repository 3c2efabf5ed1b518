"""Winograd convolution from symbolic computation (reconstruction of Mazaheri et al., 2020).

Exact Cook–Toom transforms (:mod:`~hpcnb.winograd.transforms`), straight-line programs and
their optimisation (:mod:`~hpcnb.winograd.slp`, :mod:`~hpcnb.winograd.opcount`), code
generation (:mod:`~hpcnb.winograd.codegen`) into targets that share one signature and one
table (:mod:`~hpcnb.winograd.backend`): Numba CPU (:mod:`~hpcnb.winograd.conv`),
``numba.cuda`` (:mod:`~hpcnb.winograd.cuda`, :mod:`~hpcnb.winograd.ptx`) and OpenCL
(:mod:`~hpcnb.winograd.opencl`); auto-tuning (:mod:`~hpcnb.winograd.autotune`) into a
per-machine wisdom store (:mod:`~hpcnb.winograd.wisdom`), numerics
(:mod:`~hpcnb.winograd.numerics`). Benchmarks (:mod:`~hpcnb.winograd.bench`), the
portability table (:mod:`~hpcnb.winograd.portability`) and the low-level pieces are
imported from their modules.
"""

from hpcnb.winograd.autotune import TuneResult, autotune
from hpcnb.winograd.backend import Backend, register_backend
from hpcnb.winograd.config import WinogradConfig, default_config
from hpcnb.winograd.conv import conv2d_winograd
from hpcnb.winograd.cuda import conv2d_winograd_cuda
from hpcnb.winograd.numerics import relative_error, winograd_reference
from hpcnb.winograd.opcount import op_count_table, transform_programs
from hpcnb.winograd.opencl import conv2d_winograd_opencl
from hpcnb.winograd.transforms import (
    WinogradTransform,
    check_tensor_identity,
    cook_toom,
    prove_equivalence,
)
from hpcnb.winograd.wisdom import WisdomWarning, lookup_wisdom

__all__ = [
    # Transforms: exact Cook–Toom construction and its proofs
    "WinogradTransform",
    "check_tensor_identity",
    "cook_toom",
    "prove_equivalence",
    # Straight-line programs of the transforms and their operation counts
    "op_count_table",
    "transform_programs",
    # Convolution: one configuration, one signature on every target (CPU, CUDA, OpenCL)
    "WinogradConfig",
    "default_config",
    "conv2d_winograd",
    "conv2d_winograd_cuda",
    "conv2d_winograd_opencl",
    # The table of targets: adding a target is one Backend registration
    "Backend",
    "register_backend",
    # Auto-tuning and the per-machine wisdom it stores (read only when asked)
    "TuneResult",
    "autotune",
    "WisdomWarning",
    "lookup_wisdom",
    # Numerics: the same programs in NumPy at any precision, and their error
    "relative_error",
    "winograd_reference",
]
