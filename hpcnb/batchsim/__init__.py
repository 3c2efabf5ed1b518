"""ElastiSim-style batch-system simulation of rigid, moldable, malleable and evolving jobs.

The face of the package is its core model: a platform, jobs and their work models,
workload readers and generators, schedulers (with the registry that names them) and
:func:`simulate` with its :class:`SimulationResult` metrics. Everything else is imported
from its module: the engine and the scheduler protocol (:mod:`~hpcnb.batchsim.engine`),
more policies (:mod:`~hpcnb.batchsim.policies`), SWF details and limits
(:mod:`~hpcnb.batchsim.swf`), expressions (:mod:`~hpcnb.batchsim.expressions`), DL jobs
(:mod:`~hpcnb.batchsim.dl`), experiment drivers (:mod:`~hpcnb.batchsim.experiments`) and
plots (:mod:`~hpcnb.batchsim.plots`).

Names are imported on first use (PEP 562 ``__getattr__``): ``import hpcnb.batchsim``, or
importing one module such as ``hpcnb.batchsim.swf``, does not load Matplotlib, pandas,
SciPy or Numba, so ``hpcnb batchsim simulate`` reports a bad input within a fraction of
the full start-up time.

Example:
    >>> from hpcnb.batchsim import FixedWork, Job, JobType, Platform, make_scheduler, simulate
    >>> jobs = [Job(1, 0.0, JobType.RIGID, 2, FixedWork(10.0)),
    ...         Job(2, 0.0, JobType.RIGID, 4, FixedWork(5.0))]
    >>> result = simulate(jobs, Platform(4), make_scheduler("fcfs"))
    >>> result.jobs["start"].tolist(), result.metrics()["makespan"]
    ([0.0, 10.0], 15.0)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpcnb.errors import HpcnbError

if TYPE_CHECKING:
    from hpcnb.batchsim.elastisim import read_elastisim
    from hpcnb.batchsim.jobs import FixedWork, Job, JobType, ScaledWork, WorkModel
    from hpcnb.batchsim.platform import Platform
    from hpcnb.batchsim.policies import SCHEDULERS, make_scheduler, register_scheduler
    from hpcnb.batchsim.scheduler import Scheduler
    from hpcnb.batchsim.simulation import SimulationResult, check_invariants, simulate
    from hpcnb.batchsim.swf import read_swf
    from hpcnb.batchsim.workloads import MalleablePolicy, jobs_from_swf, lublin_feitelson

__all__ = [
    # The machine: nodes, GPUs, network and parallel file system
    "Platform",
    # Jobs and the work models that time them
    "Job",
    "JobType",
    "WorkModel",
    "FixedWork",
    "ScaledWork",
    # Workloads: SWF traces, ElastiSim inputs, a synthetic generator, malleable conversion
    "read_swf",
    "jobs_from_swf",
    "lublin_feitelson",
    "MalleablePolicy",
    "read_elastisim",
    # Schedulers and the registry that names them (CLI, experiments)
    "Scheduler",
    "SCHEDULERS",
    "make_scheduler",
    "register_scheduler",
    # Running a simulation; its result carries the metrics
    "simulate",
    "SimulationResult",
    "check_invariants",
]

#: Public name -> the module of this package that defines it.
_EXPORTS: dict[str, str] = {
    "Platform": "platform",
    "Job": "jobs",
    "JobType": "jobs",
    "WorkModel": "jobs",
    "FixedWork": "jobs",
    "ScaledWork": "jobs",
    "read_swf": "swf",
    "jobs_from_swf": "workloads",
    "lublin_feitelson": "workloads",
    "MalleablePolicy": "workloads",
    "read_elastisim": "elastisim",
    "Scheduler": "scheduler",
    "SCHEDULERS": "policies",
    "make_scheduler": "policies",
    "register_scheduler": "policies",
    "simulate": "simulation",
    "SimulationResult": "simulation",
    "check_invariants": "simulation",
}


class _NoSuchNameError(HpcnbError, AttributeError):
    """A name this package does not export (an ``AttributeError``, as ``hasattr`` needs)."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise _NoSuchNameError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
