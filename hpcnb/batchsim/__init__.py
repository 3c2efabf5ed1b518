"""ElastiSim-style batch-system simulation of rigid, moldable, malleable and evolving jobs.

The public API: a discrete-event :class:`Simulator` with an ElastiSim-like scheduler
protocol (:class:`Scheduler`, :class:`SchedulerView`, :class:`InvocationReason`),
:func:`simulate` returning a :class:`SimulationResult`, jobs and work models, the safe
expression evaluator, SWF and ElastiSim readers, workload generators, DL jobs from
measured throughput tables, schedulers and plots.

Names are imported on first use (PEP 562 ``__getattr__``): importing one module such as
``hpcnb.batchsim.swf`` or running ``hpcnb batchsim simulate`` does not load Matplotlib,
SciPy or Numba, so a bad input is reported within a fraction of the full start-up time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        ApplicationWork,
        ElastiSimInput,
        ElastiSimLimits,
        WorkloadError,
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
    from hpcnb.batchsim.expressions import (
        Expression,
        ExpressionError,
        ExpressionLimits,
        evaluate,
        parse_expression,
    )
    from hpcnb.batchsim.jobs import (
        FixedWork,
        Job,
        JobType,
        RunContext,
        ScaledWork,
        WorkModel,
    )
    from hpcnb.batchsim.platform import (
        Platform,
        SharedLink,
        read_platform_xml,
    )
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
    from hpcnb.batchsim.rigid import (
        simulate_rigid_arrays,
    )
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
        MAX_NODES,
        SWF_FIELDS,
        SWFError,
        SWFFormatError,
        SWFLimits,
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

#: Public name -> the module of this package that defines it.
_EXPORTS: dict[str, str] = {
    "DRF": "policies",
    "FCFS": "scheduler",
    "JOB_STATISTICS_COLUMNS": "simulation",
    "MAX_NODES": "swf",
    "SCHEDULERS": "policies",
    "SJF": "scheduler",
    "SRTF": "policies",
    "SWF_FIELDS": "swf",
    "ApplicationModel": "elastisim",
    "ApplicationWork": "elastisim",
    "ConservativeBackfilling": "scheduler",
    "DLWork": "dl",
    "EasyBackfilling": "scheduler",
    "ElastiSimInput": "elastisim",
    "ElastiSimLimits": "elastisim",
    "Expression": "expressions",
    "ExpressionError": "expressions",
    "ExpressionLimits": "expressions",
    "FixedWork": "jobs",
    "InvocationReason": "engine",
    "Job": "jobs",
    "JobRecord": "engine",
    "JobStatus": "engine",
    "JobType": "jobs",
    "LoadedData": "experiments",
    "LublinParameters": "workloads",
    "MalleableEasy": "policies",
    "MalleablePolicy": "workloads",
    "Platform": "platform",
    "PredictorStepTime": "dl",
    "RunContext": "jobs",
    "SWFError": "swf",
    "SWFFormatError": "swf",
    "SWFLimits": "swf",
    "SWFTrace": "swf",
    "ScaledWork": "jobs",
    "Scheduler": "scheduler",
    "SchedulerError": "engine",
    "SchedulerView": "engine",
    "SharedLink": "platform",
    "SimulationError": "engine",
    "SimulationResult": "simulation",
    "Simulator": "engine",
    "StepTimeFunction": "dl",
    "StepTimeModel": "dl",
    "TraceJobs": "workloads",
    "WorkModel": "jobs",
    "WorkloadError": "elastisim",
    "check_invariants": "simulation",
    "dl_jobs": "dl",
    "evaluate": "expressions",
    "expand_into_idle": "policies",
    "jobs_from_swf": "workloads",
    "jobs_per_second": "experiments",
    "load_dl_tables": "experiments",
    "load_dl_workload": "experiments",
    "load_elastisim_example": "experiments",
    "load_trace": "experiments",
    "lublin_feitelson": "workloads",
    "make_malleable": "workloads",
    "make_scheduler": "policies",
    "malleability_gains": "experiments",
    "mape_interval": "dl",
    "parse_expression": "expressions",
    "plot_dl_fit": "plots",
    "plot_gantt": "plots",
    "plot_policy_bars": "plots",
    "plot_speed": "plots",
    "plot_utilization": "plots",
    "policy_sweep": "experiments",
    "read_application_model": "elastisim",
    "read_dl_tables": "dl",
    "read_elastisim": "elastisim",
    "read_platform_xml": "platform",
    "read_swf": "swf",
    "scaling_validation": "dl",
    "shrink_to_admit": "policies",
    "simulate": "simulation",
    "simulate_rigid_arrays": "rigid",
    "speed_vs_jobs": "experiments",
    "synthetic_dl_table": "experiments",
    "trace_from_arrays": "swf",
    "write_swf": "swf",
    "write_synthetic_elastisim_project": "experiments",
}

__all__ = [
    "DRF",
    "FCFS",
    "JOB_STATISTICS_COLUMNS",
    "MAX_NODES",
    "SCHEDULERS",
    "SJF",
    "SRTF",
    "SWF_FIELDS",
    "ApplicationModel",
    "ApplicationWork",
    "ConservativeBackfilling",
    "DLWork",
    "EasyBackfilling",
    "ElastiSimInput",
    "ElastiSimLimits",
    "Expression",
    "ExpressionError",
    "ExpressionLimits",
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
    "SWFFormatError",
    "SWFLimits",
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
    "WorkloadError",
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


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
