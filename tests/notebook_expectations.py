"""Per-notebook expectations for the notebook regression tests.

Each notebook in ``notebooks/`` is executed with ``SMOKE=True`` by
``tests/test_notebooks.py``. Every record it emits must be finite; the entry for the
notebook's stem below adds what must be present and which bounds must hold.

``required`` lists record keys that must be emitted; ``smoke`` maps keys to targets
(a number or a comparison string such as ``">= 1.0"``) checked on the SMOKE run;
``full`` maps keys to targets checked by ``hpcnb report`` and by
``tests/test_notebooks.py::test_full_run`` when ``HPCNB_FULL=1``.

Technique issues add their entry here (one per notebook; edit only your own).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Expectation:
    """What a notebook's SMOKE (and full) run must produce."""

    required: tuple[str, ...] = ()
    smoke: dict[str, float | str] = field(default_factory=dict)
    full: dict[str, float | str] = field(default_factory=dict)


EXPECTATIONS: dict[str, Expectation] = {
    "00_tour": Expectation(
        required=("tour.numba_vs_numpy", "tour.kernel_max_abs_error", "ir.trace_seconds_resnet50"),
        smoke={
            "tour.kernel_max_abs_error": "<= 1e-9",
            "tour.numba_vs_numpy": "> 0",
            "ir.half_width_flops_ratio": "< 0.5",
        },
        full={"tour.numba_vs_numpy": "> 1", "ir.trace_seconds_resnet50": "< 5"},
    ),
    "01_supernet_formation": Expectation(
        required=(
            "supernet.architectures_converted",
            "supernet.vit_flops_reduction",
            "supernet.vit_accuracy_drop",
            "supernet.vit_throughput_gain",
            "supernet.vit_latency_reduction",
            "supernet.vit_throughput_gain_197",
            "supernet.vit_latency_reduction_197",
            "supernet.vit_throughput_gain_digits",
            "supernet.vit_latency_reduction_digits",
            "supernet.forkjoin_speedup",
            "supernet.forkjoin_speedup_vs_1thread",
            "supernet.forkjoin_mpi_vs_sequential_max_diff",
            "supernet.join_order_max_diff",
            "supernet.join_bitwise_identical",
            "supernet.lastwriter_max_diff",
            "supernet.prioritized_vs_uniform",
            "supernet.prioritized_vs_uniform_shared_front",
            "supernet.forkjoin_compute_ms",
            "supernet.forkjoin_wait_ms",
            "supernet.forkjoin_allreduce_ms",
        ),
        smoke={
            "supernet.architectures_converted": ">= 4",
            "supernet.join_order_max_diff": "<= 1e-6",
            "supernet.join_bitwise_identical": ">= 1",
            "supernet.lastwriter_max_diff": "> 0",
            "supernet.forkjoin_mpi_vs_sequential_max_diff": "<= 1e-4",
            "supernet.vit_flops_reduction": "> 0",
            "supernet.forkjoin_speedup": "> 0",
        },
        full={
            "supernet.architectures_converted": ">= 4",
            "supernet.vit_flops_reduction": ">= 0.45",
            "supernet.vit_accuracy_drop": "<= 0.01",
            "supernet.vit_throughput_gain": ">= 2.5",
            "supernet.vit_latency_reduction": ">= 0.35",
            "supernet.forkjoin_speedup": ">= 1.5",
            "supernet.forkjoin_mpi_vs_sequential_max_diff": "<= 1e-4",
            "supernet.join_order_max_diff": "<= 1e-6",
            "supernet.join_bitwise_identical": ">= 1",
            "supernet.lastwriter_max_diff": "> 0",
            "supernet.prioritized_vs_uniform": "> 1.0",
        },
    ),
    "02_gnn_rl_pruning": Expectation(
        required=(
            "pruning.flops_kept",
            "pruning.gnnrl_accuracy_drop",
            "pruning.gnnrl_vs_uniform",
            "pruning.gnnrl_vs_uniform_finetuned",
            "pruning.gnnrl_vs_torch_pruning",
            "pruning.gnnrl_vs_best_other",
            "pruning.latency_aware_vs_flops_only",
            "pruning.latency_speedup",
            "pruning.latency_speedup_32",
            "pruning.latency_efficiency_32",
            "pruning.latency_speedup_32_flops_only",
            "pruning.latency_speedup_large",
            "pruning.search_seconds",
            "pruning.headline_budget",
            "pruning.gnnrl_vs_uniform_headline",
            "pruning.gnnrl_vs_torch_pruning_headline",
            "pruning.baselines_passing_bar",
            "pruning.uniform_acc_before",
            "pruning.node_features_weights_vs_random",
        ),
        smoke={
            "pruning.flops_kept": "<= 0.52",
            "pruning.baselines_passing_bar": ">= 0",
            "pruning.latency_speedup": "> 0",
            "pruning.latency_speedup_32": "> 0",
            "pruning.search_seconds": "> 0",
        },
        full={
            "pruning.flops_kept": "<= 0.52",
            "pruning.gnnrl_accuracy_drop": "<= 0.01",
            "pruning.gnnrl_vs_uniform_finetuned": ">= 0",
            "pruning.latency_speedup_32": ">= 1.6",
            "pruning.latency_efficiency_32": ">= 0.8",
        },
    ),
    "03_runtime_prediction": Expectation(
        required=(
            "perfmodel.inference_mape",
            "perfmodel.training_mape",
            "perfmodel.inference_within_10pct",
            "perfmodel.training_within_10pct",
            "perfmodel.noise_floor",
            "perfmodel.boosted_vs_convmeter",
            "perfmodel.pruned_latency_mape",
            "perfmodel.flops_only_mape",
            "perfmodel.multinode_mape",
            "perfmodel.multinode_within_10pct",
            "perfmodel.multinode_extrapolation_mape",
            "perfmodel.ddp_local_error",
        ),
        smoke={
            "perfmodel.inference_mape": "> 0",
            "perfmodel.training_mape": "> 0",
            "perfmodel.inference_within_10pct": ">= 0",
            "perfmodel.noise_floor": ">= 0",
            "perfmodel.pruned_latency_mape": "> 0",
            "perfmodel.multinode_mape": "<= 0.18",
            "perfmodel.ddp_local_error": ">= 0",
        },
        full={
            "perfmodel.inference_mape": "<= 0.12",
            "perfmodel.training_mape": "<= 0.12",
            "perfmodel.inference_within_10pct": ">= 0.6",
            "perfmodel.training_within_10pct": ">= 0.6",
            "perfmodel.pruned_latency_mape": "<= 0.15",
            "perfmodel.flops_only_vs_convmeter": "> 1",
            "perfmodel.multinode_mape": "<= 0.08",
            "perfmodel.dataset_configs": ">= 60",
        },
    ),
    "04_pipelined_speculative_inference": Expectation(
        required=(
            "speculative.lossless",
            "speculative.distilled_acceptance",
            "speculative.distilled_acceptance_open_ended",
            "speculative.distill_train_minutes",
            "speculative.acceptance_rate",
            "speculative.pipeinfer_vs_speculative",
            "speculative.pipeinfer_vs_pipeline",
            "speculative.itl_pipeinfer_over_speculative",
            "speculative.adaptive_worst_vs_pipeline",
            "speculative.pipeline_acceptance_gap",
            "speculative.sim_error_2ranks",
            "speculative.sim_max_speedup_vs_speculative",
            "speculative.sim_low_acceptance_gain",
            "speculative.sim_gpu_gain_slow_link",
            "speculative.sim_gpu_gain_retention_slow_link",
        ),
        smoke={
            "speculative.lossless": 1.0,
            "speculative.pipeline_acceptance_gap": "<= 0.01",
            "speculative.distilled_acceptance": ">= 0",
            "speculative.pipeinfer_vs_speculative": "> 0",
            "speculative.pipeinfer_vs_pipeline": "> 0",
            "speculative.sim_error_2ranks": ">= 0",
            "speculative.sim_max_speedup_vs_speculative": "> 0",
        },
        full={
            "speculative.lossless": 1.0,
            "speculative.distilled_acceptance": ">= 0.5",
            "speculative.pipeinfer_vs_speculative": ">= 1.3",
            "speculative.pipeinfer_vs_pipeline": ">= 1.5",
            "speculative.adaptive_worst_vs_pipeline": ">= 0.95",
            "speculative.pipeline_acceptance_gap": "<= 0.01",
            "speculative.sim_error_2ranks": "<= 0.15",
            "speculative.distill_train_minutes": "<= 10",
        },
    ),
    "05_malleable_batch_simulation": Expectation(
        required=(
            "batchsim.jobs_per_second",
            "batchsim.engine_jobs_per_second",
            "batchsim.easy_vs_fcfs_wait",
            "batchsim.malleable_turnaround_gain_fcfs",
            "batchsim.malleable_turnaround_gain_sjf",
            "batchsim.malleable_turnaround_gain_srtf",
            "batchsim.malleable_turnaround_gain_drf",
            "batchsim.malleable_turnaround_gain_easy",
            "batchsim.malleable_turnaround_gain_conservative",
            "batchsim.malleable_turnaround_gain_malleable",
            "batchsim.dl_scaling_mape",
            "batchsim.elastisim_example_jobs",
            "batchsim.elastisim_type_turnaround_max_error",
            "batchsim.contention_turnaround_change",
            "batchsim.cli_speedup_vs_elastisim",
            "batchsim.million_job_seconds",
            "batchsim.example_mix_jobs_per_second",
            "batchsim.topology_placement_gain",
        ),
        smoke={
            "batchsim.elastisim_example_jobs": 500,
            "batchsim.elastisim_type_turnaround_max_error": "< 1",
            "batchsim.cli_speedup_vs_elastisim": "> 0",
            "batchsim.dl_scaling_mape": "<= 0.15",
            "batchsim.jobs_per_second": "> 0",
            "batchsim.easy_vs_fcfs_wait": "> 0.5",
            "batchsim.malleable_turnaround_gain_malleable": "> 0",
            "batchsim.malleable_turnaround_gain_srtf": "> 0",
        },
        full={
            "batchsim.jobs_per_second": ">= 50000",
            "batchsim.easy_vs_fcfs_wait": ">= 1",
            "batchsim.malleable_turnaround_gain_malleable": "> 1",
            "batchsim.dl_scaling_mape": "<= 0.15",
            "batchsim.elastisim_example_jobs": 500,
            "batchsim.elastisim_type_turnaround_max_error": "<= 0.05",
        },
    ),
    "06_winograd_codegen": Expectation(
        required=(
            "winograd.max_op_reduction",
            "winograd.f63_transform_op_reduction",
            "winograd.f43_max_rel_error",
            "winograd.speedup_vs_torch",
            "winograd.speedup_vs_direct",
            "winograd.layers_faster_than_torch",
            "winograd.max_rel_error",
            "winograd.autotune_regret",
            "winograd.wisdom_round_trip",
            "winograd.f63_error_vs_standard_points",
            "winograd.f83_max_rel_error",
            "winograd.cuda_sim_validated",
            "winograd.targets_compiled",
        ),
        # regression guards (invariants); the claims' targets live in the notebook's records
        smoke={
            "winograd.max_op_reduction": ">= 0.4",  # vs zero-skipping products (F(6,3): 0.456)
            "winograd.max_op_reduction_vs_dense": ">= 0.5",
            "winograd.f63_transform_op_reduction": ">= 0.4",
            "winograd.f43_max_rel_error": "<= 1e-5",
            "winograd.max_rel_error": "<= 1e-5",
            "winograd.cuda_sim_validated": 1.0,
            "winograd.optimised_vs_naive_error_ratio": "<= 2",
            "winograd.speedup_vs_torch": "> 0",
            "winograd.autotune_regret": ">= 0",
            "winograd.wisdom_round_trip": 1.0,
            "winograd.f63_error_vs_standard_points": "<= 1",  # the common points are measured too
            "winograd.targets_compiled": ">= 1",
        },
        full={  # timings are not asserted (only > 0); OpenCL records exist only with a device
            "winograd.max_op_reduction": ">= 0.4",
            "winograd.max_op_reduction_vs_dense": ">= 0.5",
            "winograd.f43_max_rel_error": "<= 1e-5",
            "winograd.max_rel_error": "<= 1e-5",
            "winograd.speedup_vs_torch": "> 0",
            "winograd.speedup_vs_torch_b1": "> 0",
            "winograd.speedup_vs_direct": "> 1",
            "winograd.autotune_regret": ">= 0",
            "winograd.wisdom_round_trip": 1.0,
            "winograd.f63_error_vs_standard_points": "<= 1",
            "winograd.cuda_sim_validated": 1.0,
            "winograd.targets_compiled": ">= 4",
        },
    ),
    "07_communication_locality": Expectation(
        required=(
            "commprof.best_fix_speedup",
            "commprof.kernels_improved",
            "commprof.reuse_distance_rate",
            "commprof.locality_metric_agrees",
        ),
        smoke={
            "commprof.best_fix_speedup": "> 0",
            "commprof.kernels_improved": ">= 0",
            "commprof.reuse_distance_rate": "> 0",
            "commprof.locality_metric_agrees": ">= 0",
        },
        full={  # commprof.c_false_sharing_* need valgrind and gcc (absent: not emitted)
            "commprof.best_fix_speedup": ">= 1.3",
            "commprof.kernels_improved": ">= 3",
            "commprof.reuse_distance_rate": "> 0",
            "commprof.c_false_sharing_found": 1.0,
        },
    ),
    "08_loop_communication_patterns": Expectation(
        required=(
            "commprof.pattern_accuracy",
            "commprof.signature_f1_at_eighth",
            "commprof.signature_f1_at_64th",
            "commprof.signature_pattern_agreement_at_64th",
            "commprof.overhead_vs_native",
            "commprof.valgrind_match",
            "commprof.sampled_overhead",
            "commprof.sampled_matrix_correlation",
        ),
        smoke={  # the C-suite records need valgrind and gcc (absent: not emitted)
            "commprof.pattern_accuracy": 1.0,
            "commprof.signature_f1_at_eighth": ">= 0.9",
            "commprof.overhead_vs_native": "> 0",
            "commprof.valgrind_match": 1.0,
            "commprof.sampled_overhead": "> 0",
            "commprof.sampled_matrix_correlation": "> 0",
        },
        full={
            "commprof.pattern_accuracy": 1.0,
            "commprof.signature_f1_at_eighth": ">= 0.95",
            "commprof.overhead_vs_native": "<= 50",
            "commprof.valgrind_match": 1.0,
            "commprof.sampled_matrix_correlation": ">= 0.95",
            "commprof.c_suite_matrix_agreement": 1.0,
            "commprof.c_suite_pattern_accuracy": ">= 0.909",
        },
    ),
}
