"""Loop-level thread-communication profiling (DiscoPoP-style) on virtual threads.

``@kernel`` instruments a kernel written over an explicit thread id; :func:`profile` runs
it on virtual threads with exact and signature shadow memory; :mod:`.analysis` builds the
loop tree with per-region thread×thread matrices and patterns; :mod:`.suite` holds kernels
with known patterns; :mod:`.shadow` replays traces through other memory configurations;
:mod:`.locality` and :mod:`.advice` add reuse-distance locality metrics and suggestions,
:mod:`.cases` the before/after case studies, :mod:`.valgrind` the import of real traces.
"""

from hpcnb.commprof.advice import RULES, Advice, AdviceThresholds, advise, format_advice
from hpcnb.commprof.analysis import (
    PATTERNS,
    LoopNode,
    classify,
    inclusive,
    loop_tree,
    render_tree,
)
from hpcnb.commprof.cases import CASE_STUDIES, CaseStudy, Variant, measure_case
from hpcnb.commprof.instrument import InstrumentationError, Kernel, Region, kernel, prange
from hpcnb.commprof.locality import (
    LocalityConfig,
    RegionLocality,
    analyse_locality,
    brute_force_distances,
    communication_distances,
    interleave,
)
from hpcnb.commprof.plots import heatmap_grid, signature_curves
from hpcnb.commprof.runtime import (
    EXACT_BYTES_PER_ELEMENT,
    MemoryConfig,
    Profile,
    Schedule,
    profile,
    run_native,
    signature_bytes,
    time_variants,
)
from hpcnb.commprof.shadow import (
    Accuracy,
    accuracy,
    exact_table_bytes,
    replay_exact,
    replay_exact_table,
    replay_signature,
    signature_sweep,
    trace_events,
)
from hpcnb.commprof.suite import SUITE, SuiteCase, case, check_result, profile_case

__all__ = [
    "CASE_STUDIES",
    "EXACT_BYTES_PER_ELEMENT",
    "PATTERNS",
    "RULES",
    "SUITE",
    "Accuracy",
    "Advice",
    "AdviceThresholds",
    "CaseStudy",
    "InstrumentationError",
    "Kernel",
    "LocalityConfig",
    "LoopNode",
    "MemoryConfig",
    "Profile",
    "Region",
    "RegionLocality",
    "Schedule",
    "SuiteCase",
    "Variant",
    "accuracy",
    "advise",
    "analyse_locality",
    "brute_force_distances",
    "case",
    "check_result",
    "classify",
    "communication_distances",
    "exact_table_bytes",
    "format_advice",
    "heatmap_grid",
    "inclusive",
    "interleave",
    "kernel",
    "loop_tree",
    "measure_case",
    "prange",
    "profile",
    "profile_case",
    "render_tree",
    "replay_exact",
    "replay_exact_table",
    "replay_signature",
    "run_native",
    "signature_bytes",
    "signature_curves",
    "signature_sweep",
    "time_variants",
    "trace_events",
]
