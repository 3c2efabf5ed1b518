"""Winograd convolution from symbolic computation (reconstruction of Mazaheri et al., 2020).

Exact Cook–Toom transforms (:mod:`~hpcnb.winograd.transforms`), straight-line programs and
their optimisation (:mod:`~hpcnb.winograd.slp`, :mod:`~hpcnb.winograd.opcount`), code
generation (:mod:`~hpcnb.winograd.codegen`) into targets that are one
:class:`~hpcnb.winograd.backend.Backend` each, run by one call,
``conv2d_winograd(x, w, ..., target=...)`` (:mod:`~hpcnb.winograd.backend`): Numba CPU
(:mod:`~hpcnb.winograd.conv`), ``numba.cuda`` (:mod:`~hpcnb.winograd.cuda`,
:mod:`~hpcnb.winograd.ptx`) and OpenCL (:mod:`~hpcnb.winograd.opencl`), or a target of your
own named as ``"package.module:attr"``; auto-tuning (:mod:`~hpcnb.winograd.autotune`) into
a per-machine wisdom store (:mod:`~hpcnb.winograd.wisdom`), numerics
(:mod:`~hpcnb.winograd.numerics`). Benchmarks (:mod:`~hpcnb.winograd.bench`), the table of
every registered target (:mod:`~hpcnb.winograd.portability`) and the low-level pieces are
imported from their modules.
"""

# The built-in targets register themselves when their modules are imported.
from hpcnb.winograd import conv, cuda, opencl  # noqa: F401
from hpcnb.winograd.autotune import autotune
from hpcnb.winograd.backend import Backend, conv2d_winograd, register_backend
from hpcnb.winograd.config import WinogradConfig
from hpcnb.winograd.numerics import relative_error, winograd_reference
from hpcnb.winograd.opcount import op_count_table, transform_programs
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
    # Convolution: one configuration, one call for every target (a Backend each)
    "WinogradConfig",
    "conv2d_winograd",
    "Backend",
    "register_backend",
    # Auto-tuning and the per-machine wisdom it stores (read only when asked)
    "autotune",
    "WisdomWarning",
    "lookup_wisdom",
    # Numerics: the same programs in NumPy at any precision, and their error
    "relative_error",
    "winograd_reference",
]
