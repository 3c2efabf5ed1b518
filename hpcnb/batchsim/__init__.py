"""ElastiSim-style batch-system simulation of rigid, moldable, malleable and evolving jobs.

The public API: a discrete-event :class:`Simulator` with an ElastiSim-like scheduler
protocol (:class:`Scheduler`, :class:`SchedulerView`, :class:`InvocationReason`),
:func:`simulate` returning a :class:`SimulationResult`, jobs and work models, the safe
expression evaluator, SWF and ElastiSim readers, workload generators, DL jobs from
measured throughput tables, schedulers and plots.
"""

from hpcnb.batchsim.dl import (
    DLWork,
    PredictorStepTime,
    StepTimeFunction,
    StepTimeModel,
    dl_jobs,
    mape_interval,
    read_dl_tables,
    scaling_validation,
)
from hpcnb.batchsim.elastisim import (
    ApplicationModel,
    ElastiSimInput,
    read_application_model,
    read_elastisim,
)
from hpcnb.batchsim.engine import (
    InvocationReason,
    JobRecord,
    JobStatus,
    SchedulerError,
    SchedulerView,
    SimulationError,
    Simulator,
)
from hpcnb.batchsim.experiments import (
    LoadedData,
    jobs_per_second,
    load_dl_tables,
    load_dl_workload,
    load_elastisim_example,
    load_trace,
    malleability_gains,
    policy_sweep,
    speed_vs_jobs,
    synthetic_dl_table,
    write_synthetic_elastisim_project,
)
from hpcnb.batchsim.expressions import Expression, ExpressionError, evaluate, parse_expression
from hpcnb.batchsim.jobs import FixedWork, Job, JobType, RunContext, ScaledWork, WorkModel
from hpcnb.batchsim.platform import Platform, SharedLink, read_platform_xml
from hpcnb.batchsim.plots import (
    plot_dl_fit,
    plot_gantt,
    plot_policy_bars,
    plot_speed,
    plot_utilization,
)
from hpcnb.batchsim.policies import (
    DRF,
    SCHEDULERS,
    SRTF,
    MalleableEasy,
    expand_into_idle,
    make_scheduler,
    shrink_to_admit,
)
from hpcnb.batchsim.rigid import simulate_rigid_arrays
from hpcnb.batchsim.scheduler import (
    FCFS,
    SJF,
    ConservativeBackfilling,
    EasyBackfilling,
    Scheduler,
)
from hpcnb.batchsim.simulation import (
    JOB_STATISTICS_COLUMNS,
    SimulationResult,
    check_invariants,
    simulate,
)
from hpcnb.batchsim.swf import (
    SWF_FIELDS,
    SWFError,
    SWFTrace,
    read_swf,
    trace_from_arrays,
    write_swf,
)
from hpcnb.batchsim.workloads import (
    LublinParameters,
    MalleablePolicy,
    TraceJobs,
    jobs_from_swf,
    lublin_feitelson,
    make_malleable,
)

__all__ = [
    "DRF",
    "FCFS",
    "JOB_STATISTICS_COLUMNS",
    "SCHEDULERS",
    "SJF",
    "SRTF",
    "SWF_FIELDS",
    "ApplicationModel",
    "ConservativeBackfilling",
    "DLWork",
    "EasyBackfilling",
    "ElastiSimInput",
    "Expression",
    "ExpressionError",
    "FixedWork",
    "InvocationReason",
    "Job",
    "JobRecord",
    "JobStatus",
    "JobType",
    "LoadedData",
    "LublinParameters",
    "MalleableEasy",
    "MalleablePolicy",
    "Platform",
    "PredictorStepTime",
    "RunContext",
    "SWFError",
    "SWFTrace",
    "ScaledWork",
    "Scheduler",
    "SchedulerError",
    "SchedulerView",
    "SharedLink",
    "SimulationError",
    "SimulationResult",
    "Simulator",
    "StepTimeFunction",
    "StepTimeModel",
    "TraceJobs",
    "WorkModel",
    "check_invariants",
    "dl_jobs",
    "evaluate",
    "expand_into_idle",
    "jobs_from_swf",
    "jobs_per_second",
    "load_dl_tables",
    "load_dl_workload",
    "load_elastisim_example",
    "load_trace",
    "lublin_feitelson",
    "make_malleable",
    "make_scheduler",
    "malleability_gains",
    "mape_interval",
    "parse_expression",
    "plot_dl_fit",
    "plot_gantt",
    "plot_policy_bars",
    "plot_speed",
    "plot_utilization",
    "policy_sweep",
    "read_application_model",
    "read_dl_tables",
    "read_elastisim",
    "read_platform_xml",
    "read_swf",
    "scaling_validation",
    "shrink_to_admit",
    "simulate",
    "simulate_rigid_arrays",
    "speed_vs_jobs",
    "synthetic_dl_table",
    "trace_from_arrays",
    "write_swf",
    "write_synthetic_elastisim_project",
]
