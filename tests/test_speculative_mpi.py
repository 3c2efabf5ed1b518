"""MPI tests of the pipeline runtime: lossless strategies, cancellation, failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcnb.launch import MPIRunError
from hpcnb.speculative import (
    EarlyExitDraftSpec,
    GenerationSpec,
    JobSpec,
    ModelSpec,
    NgramDraftSpec,
    run_pipeline_mpi,
)
from hpcnb.speculative.contracts import FaultSpec
from hpcnb.speculative.stages import model_from_spec

pytestmark = pytest.mark.mpi

MODEL = ModelSpec("tiny", n_layers=4, vocab_size=96, seed=2)
PROMPT = [1, 5, 9, 3, 7, 5, 9, 3]
N_NEW = 32


def test_all_strategies_lossless_and_cancellation_skips_work() -> None:
    ref = model_from_spec(MODEL).greedy(PROMPT, N_NEW)
    base = GenerationSpec("pipeline", PROMPT, N_NEW, k=3, max_inflight=4)
    early_exit = EarlyExitDraftSpec(layers=1)
    runs = [
        base,
        replace(base, strategy="speculative", draft=early_exit),
        replace(base, strategy="pipeinfer", draft=early_exit),
        replace(base, strategy="pipeinfer", draft=NgramDraftSpec()),
    ]
    job = JobSpec(MODEL, runs, timeout_s=20, stage_delay_s={1: 0.004})
    results = run_pipeline_mpi(job, n_ranks=2, timeout_s=80)
    assert [r.strategy for r in results] == [r.strategy for r in runs]
    for r in results:
        assert list(r.tokens) == ref, r.strategy
        assert 0 <= r.accepted <= r.drafted
    pipe = results[2]
    assert pipe.cancelled_runs > 0
    assert pipe.skipped[1] > 0  # rank 1 dropped cancelled runs instead of computing them
    skipped = [e for e in pipe.events if e.kind == "skip"]
    assert skipped and all(e.rank == 1 for e in skipped)
    # a skipped run was not computed on rank 1
    computed_ids = {e.run_id for e in pipe.events if e.rank == 1 and e.kind == "compute"}
    assert not computed_ids & {e.run_id for e in skipped}


@pytest.mark.parametrize("kind", ["kill", "hang"])
def test_failed_rank_ends_the_job(kind: str) -> None:
    job = JobSpec(
        MODEL,
        [GenerationSpec("pipeline", PROMPT, N_NEW)],
        timeout_s=4,
        fault=FaultSpec(rank=1, kind=kind, after=3),
    )
    with pytest.raises(MPIRunError) as err:
        run_pipeline_mpi(job, n_ranks=2, timeout_s=60)
    if kind == "hang":
        assert "no result from rank 1" in str(err.value)
