"""Loop-level thread-communication profiling (DiscoPoP-style) on virtual threads.

``@kernel`` instruments a kernel written over an explicit thread id; :func:`profile` runs
it on virtual threads with exact and signature shadow memory; :func:`loop_tree` and
:func:`classify_pattern` give per-loop thread×thread matrices and their patterns;
:func:`analyse_locality` and :func:`advise` turn a trace into reuse-distance locality
metrics and suggestions; :data:`SUITE` holds kernels with known patterns.

The pieces behind these are imported from their modules: :mod:`~hpcnb.commprof.shadow`
(signature memories replayed over traces, detection accuracy, held-out tuning),
:mod:`~hpcnb.commprof.cases` (before/after case studies),
:mod:`~hpcnb.commprof.blind` (the advice run blind on unmodified kernels, the fixes it names
timed, precision and recall), :mod:`~hpcnb.commprof.runtime`
(interleaved timing of native and instrumented runs), :mod:`~hpcnb.commprof.sampling`
(sampled profiles, scaled matrices and their error bound), :mod:`~hpcnb.commprof.plots`
(figures), :mod:`~hpcnb.commprof.hooks` and :mod:`~hpcnb.commprof.kernels`.

Unmodified compiled programs (``hpcnb commprof profile -- PROGRAM ARGS``):
:mod:`~hpcnb.commprof.valgrind` (run under valgrind lackey, threads, objects, accesses),
:mod:`~hpcnb.commprof.binary` (symbols, line table, loops from back edges),
:mod:`~hpcnb.commprof.report` (matrix, objects, loops, report files),
:mod:`~hpcnb.commprof.csuite` (the kernel suite in C against the Numba profiles) and
:mod:`~hpcnb.commprof.native` (compiling and timing the package's C programs).

Example:
    >>> import numpy as np
    >>> from hpcnb.commprof import classify_pattern, inclusive, kernel, prange, profile
    >>> @kernel
    ... def ring_shift(tid, nthreads, phase, a, b):
    ...     for i in prange(a.shape[0]):
    ...         if phase == 0:
    ...             a[i] = tid
    ...         else:
    ...             b[i] = a[(i + a.shape[0] // nthreads) % a.shape[0]]
    >>> p = profile(ring_shift, [np.zeros(8), np.zeros(8)], nthreads=4, nphases=2)
    >>> classify_pattern(inclusive(p.regions, p.exact)[0])
    'ring'
"""

from hpcnb.commprof.advice import advise, format_advice
from hpcnb.commprof.analysis import classify_pattern, inclusive, loop_tree
from hpcnb.commprof.instrument import InstrumentationError, Kernel, Region, kernel, prange
from hpcnb.commprof.locality import LocalityConfig, analyse_locality
from hpcnb.commprof.runtime import MemoryConfig, Profile, Schedule, profile, run_native
from hpcnb.commprof.suite import SUITE, profile_case

__all__ = [
    # Instrumenting a kernel written over an explicit thread id
    "kernel",
    "prange",
    "Kernel",
    "Region",
    "InstrumentationError",
    # Running it on virtual threads with shadow memories
    "profile",
    "run_native",
    "Profile",
    "MemoryConfig",
    "Schedule",
    # Communication matrices per loop and their patterns
    "inclusive",
    "loop_tree",
    "classify_pattern",
    # Locality metrics and suggestions
    "analyse_locality",
    "LocalityConfig",
    "advise",
    "format_advice",
    # The kernel suite with known patterns
    "SUITE",
    "profile_case",
]
