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
    classify_pattern,
    inclusive,
    loop_tree,
    render_tree,
)
from hpcnb.commprof.cases import CASE_STUDIES, CaseStudy, Variant, count_improved, measure_case
from hpcnb.commprof.instrument import InstrumentationError, Kernel, Region, kernel, prange
from hpcnb.commprof.locality import (
    LocalityConfig,
    RegionLocality,
    analyse_locality,
    brute_force_distances,
    communication_distances,
    interleave,
    producing_write,
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
    time_variant_samples,
    time_variants,
)
from hpcnb.commprof.shadow import (
    DetectionAccuracy,
    HeldOutScore,
    SignatureChoice,
    choose_signature,
    detection_accuracy,
    exact_table_bytes,
    held_out_f1,
    replay_exact,
    replay_exact_table,
    replay_signature,
    signature_slots,
    signature_sweep,
    split_kernels,
    trace_events,
)
from hpcnb.commprof.suite import SUITE, SuiteCase, check_result, profile_case, suite_case

__all__ = [
    "CASE_STUDIES",
    "EXACT_BYTES_PER_ELEMENT",
    "PATTERNS",
    "RULES",
    "SUITE",
    "DetectionAccuracy",
    "Advice",
    "AdviceThresholds",
    "CaseStudy",
    "HeldOutScore",
    "InstrumentationError",
    "Kernel",
    "LocalityConfig",
    "LoopNode",
    "MemoryConfig",
    "Profile",
    "Region",
    "RegionLocality",
    "Schedule",
    "SignatureChoice",
    "SuiteCase",
    "Variant",
    "detection_accuracy",
    "advise",
    "analyse_locality",
    "brute_force_distances",
    "check_result",
    "choose_signature",
    "classify_pattern",
    "communication_distances",
    "count_improved",
    "exact_table_bytes",
    "format_advice",
    "heatmap_grid",
    "held_out_f1",
    "inclusive",
    "interleave",
    "kernel",
    "loop_tree",
    "measure_case",
    "prange",
    "producing_write",
    "profile",
    "profile_case",
    "render_tree",
    "replay_exact",
    "replay_exact_table",
    "replay_signature",
    "run_native",
    "signature_bytes",
    "signature_curves",
    "signature_slots",
    "signature_sweep",
    "split_kernels",
    "suite_case",
    "time_variant_samples",
    "time_variants",
    "trace_events",
]
