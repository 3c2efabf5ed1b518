"""Deep-learning jobs whose scaling comes from measured training throughput.

The measured tables (Pollux artifact format, ``<model>/scalability.csv`` with
``num_nodes, num_replicas, local_bsz, step_time, sync_time`` and
``<model>/placements.csv``) give seconds per training step. :class:`StepTimeModel`
is the workload model we fit to them, written as ElastiSim-style expressions and
evaluated with the safe evaluator:

* compute per replica: ``t_compute = c0 + c1 · local_bsz`` (a GPU task whose flops
  grow with the per-GPU batch);
* gradient all-reduce among ``r`` replicas on ``m`` nodes (ring, Hockney):
  ``t_sync = 2(r-1)·lat + 2(m-1)/m · bytes_over_bw`` (only inter-node links limit
  bandwidth);
* overlap of the two (back-propagation overlaps communication):
  ``step = (t_compute^g + t_sync^g)^(1/g)`` with ``g >= 1``.

The five parameters are fitted by least squares on the relative error.
:func:`scaling_validation` reports the mean absolute percentage error (MAPE) of
predictions on runs left out of the fit: by cross-validation over all runs, or by
extrapolation from small to large node counts; :func:`step_time_mape` gives the mean of
several models' MAPEs a bootstrap interval.

:class:`DLWork` uses a fitted model as a job's work: a fixed number of steps with a
fixed global batch split over ``nodes × gpus_per_node`` replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from hpcnb.batchsim.expressions import parse_expression
from hpcnb.batchsim.jobs import Job, JobType, RunContext, WorkModel
from hpcnb.errors import InvalidInputError, MissingFileError
from hpcnb.stats import Estimate, mape_interval

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "DLWork",
    "PredictorStepTime",
    "StepTimeFunction",
    "StepTimeModel",
    "StepTimePredictor",
    "dl_jobs",
    "read_dl_tables",
    "scaling_validation",
    "step_time_mape",
]

STEP_EXPRESSION = (
    "((c0 + c1*local_bsz)^g + (2*(num_replicas-1)*lat"
    " + 2*(num_nodes-1)/num_nodes*bytes_over_bw)^g)^(1/g)"
)
_PARAMS = ("c0", "c1", "lat", "bytes_over_bw", "g")


def read_dl_tables(model_dir: str | Path, placements: bool = False) -> pd.DataFrame:
    """Read ``scalability.csv`` (and, if asked, ``placements.csv``) of one model.

    Args:
        model_dir: Folder of one model.
        placements: Also read the small-placement table (1–4 nodes, packed GPUs).

    Returns:
        Columns ``num_nodes, num_replicas, local_bsz, step_time`` (placements give
        ``num_nodes = len(placement)`` and ``num_replicas = sum of its digits``).

    Raises:
        MissingFileError: ``scalability.csv`` is missing.
        InvalidInputError: A required column is missing (the message names the file).
    """
    model_dir = Path(model_dir)
    path = model_dir / "scalability.csv"
    if not path.exists():
        raise MissingFileError(f"{path}: measured scalability table not found")
    frames = [pd.read_csv(path)]
    extra = model_dir / "placements.csv"
    if placements and extra.exists():
        p = pd.read_csv(extra, dtype={"placement": str})
        if "placement" not in p.columns:
            raise InvalidInputError(f"{extra}: missing column 'placement'")
        p["num_nodes"] = p["placement"].str.len()
        p["num_replicas"] = p["placement"].map(lambda s: sum(int(c) for c in s))
        frames.append(p)
    out = pd.concat(frames, ignore_index=True)
    for column in ("num_nodes", "num_replicas", "local_bsz", "step_time"):
        if column not in out.columns:
            raise InvalidInputError(f"{path}: missing column {column!r}")
    return out[["num_nodes", "num_replicas", "local_bsz", "step_time"]].astype(float)


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per training step as a function of nodes, replicas and per-GPU batch.

    Attributes:
        params: Fitted ``c0, c1, lat, bytes_over_bw, g``.
        expression: The expression text evaluated (see the module docstring).
    """

    params: dict[str, float]
    expression: str = STEP_EXPRESSION

    def step_time(self, num_nodes: float, num_replicas: float, local_bsz: float) -> float:
        """Evaluate the model for one configuration.

        Args:
            num_nodes: Nodes the replicas run on.
            num_replicas: Data-parallel replicas (GPUs) in all.
            local_bsz: Samples per replica per step.

        Returns:
            Seconds per training step.
        """
        env = {
            **self.params,
            "num_nodes": num_nodes,
            "num_replicas": num_replicas,
            "local_bsz": local_bsz,
        }
        return parse_expression(self.expression).evaluate(env)

    def predict(self, table: pd.DataFrame) -> np.ndarray:
        """Evaluate the model on every row of a table."""
        return np.array(
            [
                self.step_time(r.num_nodes, r.num_replicas, r.local_bsz)
                for r in table.itertuples(index=False)
            ]
        )

    @staticmethod
    def _vector(x: np.ndarray, t: pd.DataFrame) -> np.ndarray:
        c0, c1, lat, bw, g = x
        compute = c0 + c1 * t["local_bsz"].to_numpy()
        m = t["num_nodes"].to_numpy()
        sync = 2 * (t["num_replicas"].to_numpy() - 1) * lat + 2 * (m - 1) / m * bw
        return (compute**g + sync**g) ** (1 / g)

    @classmethod
    def fit(cls, table: pd.DataFrame) -> StepTimeModel:
        """Fit the five parameters on a table (relative least squares).

        Raises:
            InvalidInputError: Fewer than five rows.
        """
        if len(table) < 5:
            raise InvalidInputError(f"need at least 5 measurements to fit, got {len(table)}")
        y = table["step_time"].to_numpy()

        def residual(x: np.ndarray) -> np.ndarray:
            return cls._vector(x, table) / y - 1.0

        x0 = np.array([float(np.min(y)) / 2, float(np.median(y)) / 500, 1e-3, float(np.min(y)), 2])
        fit = least_squares(residual, x0, bounds=([0, 0, 0, 0, 1.0], [np.inf] * 4 + [20.0]))
        return cls(dict(zip(_PARAMS, (float(v) for v in fit.x), strict=True)))


def scaling_validation(
    model_dir: str | Path | pd.DataFrame,
    train_max_nodes: int | None = None,
    folds: int = 5,
    seed: int = 0,
) -> tuple[StepTimeModel, pd.DataFrame, float]:
    """Measure how well the workload model predicts measured step times it was not fit on.

    Two protocols: with ``train_max_nodes`` set, fit on runs with at most that many
    nodes and test on the larger ones (extrapolation); otherwise ``folds``-fold
    cross-validation over all runs (seeded shuffle), every row predicted by a model
    fitted without it.

    Args:
        model_dir: A model folder (see :func:`read_dl_tables`) or its table.
        train_max_nodes: Extrapolation protocol threshold; ``None`` for cross-validation.
        folds: Folds of the cross-validation.
        seed: Seed of the fold assignment.

    Returns:
        ``(model fitted on all rows, tested rows with a 'predicted' column, MAPE)``.

    Raises:
        MissingFileError: The folder has no ``scalability.csv``.
        InvalidInputError: A fit with fewer than five rows, or no run above
            ``train_max_nodes``.
    """
    table = model_dir if isinstance(model_dir, pd.DataFrame) else read_dl_tables(model_dir)
    if train_max_nodes is not None:
        train = table[table["num_nodes"] <= train_max_nodes]
        test = table[table["num_nodes"] > train_max_nodes].copy()
        if test.empty:
            raise InvalidInputError(f"{model_dir}: no runs with more than {train_max_nodes} nodes")
        test["predicted"] = StepTimeModel.fit(train).predict(test)
    else:
        test = table.copy()
        fold = np.random.default_rng(seed).permutation(len(table)) % folds
        predicted = np.empty(len(table))
        for k in range(folds):
            model_k = StepTimeModel.fit(table[fold != k])
            predicted[fold == k] = model_k.predict(table[fold == k])
        test["predicted"] = predicted
    mape = float(np.mean(np.abs(test["predicted"] / test["step_time"] - 1.0)))
    return StepTimeModel.fit(table), test, mape


def step_time_mape(
    tests: Mapping[str, pd.DataFrame],
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Estimate:
    """Mean over models of each model's MAPE of step times, with a stratified bootstrap.

    Each table holds ``step_time`` and ``predicted`` (as returned by
    :func:`scaling_validation`). The ratios ``predicted / step_time`` of all tables,
    labelled by model, go to :func:`hpcnb.stats.mape_interval` against 1, so each row's
    error is ``|predicted / step_time - 1|`` as in :func:`scaling_validation`. A bootstrap
    replicate resamples every model's rows with replacement (each model keeps its size)
    and takes the mean of the per-model MAPEs; the interval is the percentile interval of
    the replicates (seeded, reproducible).

    Args:
        tests: Tested table of each model, by model name.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling generator.
        confidence: Coverage of the interval, in (0, 1).

    Returns:
        The :class:`~hpcnb.stats.Estimate` of the MAPE (a fraction) with ``n`` the number
        of predicted runs in all.

    Raises:
        InvalidInputError: No tables, a table without rows, or a measured step time that
            is not finite and positive.
        StatisticsError: A predicted step time that is not finite.

    Example:
        >>> table = pd.DataFrame({"step_time": [1.0, 2.0], "predicted": [1.1, 2.0]})
        >>> e = step_time_mape({"m": table}, resamples=100)
        >>> round(e.value, 3), e.n
        (0.05, 2)
    """
    if not tests:
        raise InvalidInputError("step_time_mape: no tested tables")
    ratios, labels = [], []
    for name, test in tests.items():
        if len(test) == 0:
            raise InvalidInputError(f"step_time_mape: table {name!r} has no rows")
        measured = test["step_time"].to_numpy(float)
        if not np.all(np.isfinite(measured) & (measured > 0)):
            raise InvalidInputError(
                f"step_time_mape: table {name!r} has a step time that is not finite and positive"
            )
        ratios.append(test["predicted"].to_numpy(float) / measured)
        labels += [name] * len(test)
    ratio = np.concatenate(ratios)
    # predicted / measured against 1: the errors |p/m - 1| of scaling_validation's MAPE
    return mape_interval(
        ratio,
        np.ones_like(ratio),
        groups=labels,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


class StepTimeFunction(Protocol):
    """Anything that gives seconds per step for (nodes, replicas, per-GPU batch)."""

    def step_time(self, num_nodes: float, num_replicas: float, local_bsz: float) -> float:
        """Return seconds per training step.

        Args:
            num_nodes: Nodes the replicas run on.
            num_replicas: Data-parallel replicas (GPUs) in all.
            local_bsz: Samples per replica per step.
        """
        ...


class StepTimePredictor(Protocol):
    """A fitted model that predicts seconds per step for arrays of configurations."""

    def predict(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike
    ) -> ArrayLike:
        """Return seconds per step of each configuration.

        Args:
            num_nodes: Nodes of each configuration.
            num_replicas: Data-parallel replicas of each configuration.
            local_bsz: Samples per replica per step of each configuration.
        """
        ...


@dataclass(frozen=True)
class PredictorStepTime:
    """Adapter for a fitted model with ``predict(num_nodes, num_replicas, local_bsz)``.

    For instance ConvMeter's multi-node model, ``hpcnb.perfmodel.ScalingModel``, fitted
    on ``placements.csv``: ``DLWork(PredictorStepTime(model), ...)``.

    Attributes:
        predictor: The fitted model (array in, array of seconds per step out).
    """

    predictor: StepTimePredictor

    def step_time(self, num_nodes: float, num_replicas: float, local_bsz: float) -> float:
        """Return the predictor's seconds per step for one configuration.

        Args:
            num_nodes: Nodes the replicas run on.
            num_replicas: Data-parallel replicas (GPUs) in all.
            local_bsz: Samples per replica per step.
        """
        out = self.predictor.predict([num_nodes], [num_replicas], [local_bsz])
        return float(np.asarray(out, dtype=float).reshape(-1)[0])


@dataclass(frozen=True, eq=False)
class DLWork(WorkModel):
    """A data-parallel training job: ``steps`` steps of a fixed ``global_batch``.

    Attributes:
        model: The fitted step-time model (:class:`StepTimeModel`, or any
            :class:`StepTimeFunction` such as :class:`PredictorStepTime`).
        steps: Training steps in total.
        global_batch: Samples per step, split over the replicas.
        gpus_per_node: Replicas per node.
        units: Iterations (scheduling points between them).
        reconfiguration_cost: Cost of a resize (checkpoint and restart) in seconds.
    """

    model: StepTimeFunction
    steps: float
    global_batch: float
    gpus_per_node: int = 4
    units: int = 10
    reconfiguration_cost: float = 30.0
    num_units: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_units", self.units)

    def unit_time(self, unit: int, nodes: int, ctx: RunContext | None) -> float:
        """Return ``steps / units`` steps on ``nodes × gpus_per_node`` replicas.

        Args:
            unit: The iteration (all take the same time).
            nodes: Nodes the job runs on.
            ctx: The machine's state (not used: the step time depends on the size alone).
        """
        replicas = nodes * self.gpus_per_node
        step = self.model.step_time(nodes, replicas, max(1.0, self.global_batch / replicas))
        return self.steps / self.units * step

    def reconfiguration_time(self, old: int, new: int, ctx: RunContext | None) -> float:
        """Return the fixed checkpoint–restart cost.

        Args:
            old: Nodes before the resize.
            new: Nodes after it.
            ctx: The machine's state (not used).
        """
        return self.reconfiguration_cost

    def estimate(self, nodes: int, ctx: RunContext | None, from_unit: int = 0) -> float:
        """Return the remaining time in closed form.

        Args:
            nodes: Nodes the job runs on.
            ctx: The machine's state (not used; ``None`` is accepted).
            from_unit: First iteration still to run.
        """
        return max(0, self.units - from_unit) * self.unit_time(0, nodes, ctx)


def dl_jobs(
    workload: pd.DataFrame,
    models: Mapping[str, StepTimeFunction],
    durations: np.ndarray,
    seed: int = 0,
    gpus_per_node: int = 4,
    max_nodes: int = 16,
    malleable: bool = True,
) -> list[Job]:
    """Build DL jobs from a Pollux-style workload table.

    Each row (``name, time, application, num_replicas, batch_size``) becomes a job
    submitted at ``time`` that prefers ``ceil(num_replicas / gpus_per_node)`` nodes. Its
    length is set so that at the preferred size it runs for a duration drawn (seeded)
    from ``durations`` (e.g. Philly job durations); at other sizes the fitted model
    scales it. Jobs are malleable in ``[1, max_nodes]`` nodes, or rigid.

    Args:
        workload: One row per job: ``name, time, application, num_replicas, batch_size``.
        models: Fitted step-time model of each application.
        durations: Run times (s) at the preferred size to draw from.
        seed: Seed of the draw of durations.
        gpus_per_node: GPUs (replicas) per node.
        max_nodes: Largest size of a job (and its preferred size at most).
        malleable: Make the jobs malleable (``True``) or rigid.

    Returns:
        The jobs, numbered from 0 in the order of the rows.

    Raises:
        InvalidInputError: An application has no fitted model.
    """
    rng = np.random.default_rng(seed)
    jobs: list[Job] = []
    for k, row in enumerate(workload.itertuples(index=False)):
        if row.application not in models:
            raise InvalidInputError(f"workload row {k}: no measured model for {row.application!r}")
        nodes = int(min(max_nodes, max(1, -(-int(row.num_replicas) // gpus_per_node))))
        target = float(rng.choice(durations))
        probe = DLWork(models[row.application], 1.0, float(row.batch_size), gpus_per_node)
        steps = target / probe.estimate(nodes, None)
        work = DLWork(models[row.application], steps, float(row.batch_size), gpus_per_node)
        kind = JobType.MALLEABLE if malleable else JobType.RIGID
        jobs.append(
            Job(
                k,
                float(row.time),
                kind,
                nodes,
                work,
                1 if malleable else nodes,
                max_nodes if malleable else nodes,
                gpus_per_node=gpus_per_node,
                user=k,
            )
        )
    return jobs
