"""MPI tests of the pipeline runtime: lossless strategies, cancellation, failures."""

from __future__ import annotations

import pytest

from hpcnb.launch import MPIRunError
from hpcnb.speculative import model_from_spec, run_pipeline_mpi

pytestmark = pytest.mark.mpi

MODEL = {"kind": "tiny", "n_layers": 4, "vocab_size": 96, "seed": 2}
PROMPT = [1, 5, 9, 3, 7, 5, 9, 3]
N_NEW = 32


def test_all_strategies_lossless_and_cancellation_skips_work() -> None:
    ref = model_from_spec(MODEL).greedy(PROMPT, N_NEW)
    runs = [
        {"strategy": "pipeline", "draft": None},
        {"strategy": "speculative", "draft": {"kind": "early_exit", "layers": 1}},
        {"strategy": "pipeinfer", "draft": {"kind": "early_exit", "layers": 1}},
        {"strategy": "pipeinfer", "draft": {"kind": "ngram"}},
    ]
    spec = {
        "model": MODEL,
        "prompt": PROMPT,
        "n_new": N_NEW,
        "k": 3,
        "max_inflight": 4,
        "timeout_s": 20,
        "stage_delay_s": {"1": 0.004},
        "runs": runs,
    }
    results = run_pipeline_mpi(spec, n_ranks=2, timeout_s=80)
    assert [r["strategy"] for r in results] == [r["strategy"] for r in runs]
    for r in results:
        assert r["tokens"] == ref, r["strategy"]
        assert 0 <= r["accepted"] <= r["drafted"]
    pipe = results[2]
    assert pipe["cancelled_runs"] > 0
    assert pipe["skipped"][1] > 0  # rank 1 dropped cancelled runs instead of computing them
    skipped = [e for e in pipe["events"] if e[2] == "skip"]
    assert skipped and all(e[0] == 1 for e in skipped)
    # a skipped run was not computed on rank 1
    computed_ids = {e[1] for e in pipe["events"] if e[0] == 1 and e[2] == "compute"}
    assert not computed_ids & {e[1] for e in skipped}


@pytest.mark.parametrize("kind", ["kill", "hang"])
def test_failed_rank_ends_the_job(kind: str) -> None:
    spec = {
        "model": MODEL,
        "prompt": PROMPT,
        "n_new": N_NEW,
        "strategy": "pipeline",
        "timeout_s": 4,
        "fault": {"rank": 1, "kind": kind, "after": 3},
    }
    with pytest.raises(MPIRunError) as err:
        run_pipeline_mpi(spec, n_ranks=2, timeout_s=60)
    if kind == "hang":
        assert "no result from rank 1" in str(err.value)
