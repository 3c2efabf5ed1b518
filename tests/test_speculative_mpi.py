"""MPI tests of the pipeline runtime: lossless strategies, cancellation, failures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpcnb.launch import MPIRunError
from hpcnb.speculative import (
    EarlyExitDraftSpec,
    GenerationSpec,
    JobSpec,
    NgramDraftSpec,
    TransformerSpec,
    run_pipeline_mpi,
)
from hpcnb.speculative.contracts import FaultSpec
from hpcnb.speculative.drafts import DistilledDraftSpec
from hpcnb.speculative.stages import model_from_spec

pytestmark = pytest.mark.mpi

MODEL = TransformerSpec("tiny", n_layers=4, vocab_size=96, seed=2)
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


def test_every_strategy_and_draft_lossless_adaptive_and_acceptance_as_in_process(
    tmp_path: Path,
) -> None:
    """Tiny model, 2 ranks: every strategy x draft (fixed and adaptive) gives the greedy
    tokens; the MPI acceptance of fixed-k speculation equals the offline replay's."""
    from hpcnb.speculative.distill import DistillSettings, distill_draft, save_draft
    from hpcnb.speculative.drafts import ModelDraft, measure_acceptance

    target = model_from_spec(MODEL)
    ref = target.greedy(PROMPT, N_NEW)
    settings = DistillSettings(
        n_layers=1,
        dim=32,
        ffn_dim=64,
        n_heads=2,
        n_kv_heads=1,
        n_new=16,
        steps=20,
        batch=8,
        vocab=96,
    )
    trained = distill_draft(target, [PROMPT[:3], PROMPT[2:7], [4, 8, 15, 16]], settings)
    path = str(save_draft(tmp_path / "tiny.safetensors", trained))
    drafts = {
        "ngram": NgramDraftSpec(),
        "early_exit": EarlyExitDraftSpec(layers=1),
        "distilled": DistilledDraftSpec(path),
        "never": DistilledDraftSpec(path, shift=1),
    }
    base = GenerationSpec("pipeline", PROMPT, N_NEW, k=3, max_inflight=3)
    runs = [base]
    for draft in drafts.values():
        for strategy in ("speculative", "pipeinfer"):
            for adaptive in (False, True):
                runs.append(
                    replace(
                        base,
                        strategy=strategy,
                        draft=draft,
                        adaptive=adaptive,
                        plain_drafts=adaptive,
                    )
                )
    results = run_pipeline_mpi(JobSpec(MODEL, runs, timeout_s=20), n_ranks=2, timeout_s=120)
    for gen, r in zip(runs, results, strict=True):
        assert list(r.tokens) == ref, (gen.strategy, gen.draft, gen.adaptive)
    # fixed-k standard speculation: the head sees the target's argmax, so the acceptance
    # over MPI is the offline replay's exactly
    offline = measure_acceptance(ModelDraft(trained.model, vocab=trained.vocab), PROMPT, ref, 3)
    mpi = next(
        r
        for g, r in zip(runs, results, strict=True)
        if g.draft == drafts["distilled"] and g.strategy == "speculative" and not g.adaptive
    )
    assert (mpi.accepted, mpi.drafted) == (offline["accepted"], offline["drafted"])
    never = [r for g, r in zip(runs, results, strict=True) if g.draft == drafts["never"]]
    assert all(r.accepted <= 1 for r in never)


def test_feature_draft_lossless_over_two_ranks_and_acceptance_as_in_process(
    tmp_path: Path,
) -> None:
    """The feature draft reads hidden states the last rank sends back: every strategy
    stays lossless, and fixed-k speculation accepts what the offline replay accepts."""
    from hpcnb.speculative.drafts import measure_acceptance
    from hpcnb.speculative.feature import FeatureDraftSettings, train_feature_draft
    from hpcnb.speculative.feature_cache import save_feature_draft
    from hpcnb.speculative.feature_draft import FeatureDraft, FeatureDraftSpec
    from hpcnb.speculative.features import target_features

    target = model_from_spec(MODEL)
    ref = target.greedy(PROMPT, N_NEW)
    seqs = [PROMPT + ref, [4, 8, 15, 16, 23, *target.greedy([4, 8, 15, 16, 23], 24)]]
    trained = train_feature_draft(target, seqs, FeatureDraftSettings(vocab=96, steps=30, lr=3e-3))
    path = str(save_feature_draft(tmp_path / "feature.safetensors", trained))
    drafts = {
        "feature": FeatureDraftSpec(path),
        "cascade": FeatureDraftSpec(path, ngram_first=True),
        "never": FeatureDraftSpec(path, shift=1),
    }
    base = GenerationSpec("pipeline", PROMPT, N_NEW, k=3, max_inflight=3)
    runs = []
    for draft in drafts.values():
        for strategy in ("speculative", "pipeinfer"):
            for adaptive in (False, True):
                runs.append(
                    replace(
                        base, strategy=strategy, draft=draft, adaptive=adaptive, plain_drafts=True
                    )
                )
    results = run_pipeline_mpi(JobSpec(MODEL, runs, timeout_s=20), n_ranks=2, timeout_s=120)
    for gen, r in zip(runs, results, strict=True):
        assert list(r.tokens) == ref, (gen.strategy, gen.draft, gen.adaptive)
    offline = measure_acceptance(
        FeatureDraft.from_target(trained.head, target),
        PROMPT,
        ref,
        3,
        features=target_features(target, PROMPT + ref),
    )
    fixed = results[0]  # feature draft, fixed-k standard speculation
    assert fixed.drafted > 0
    assert (fixed.accepted, fixed.drafted) == (offline["accepted"], offline["drafted"])
    assert all(
        r.accepted <= 1 for g, r in zip(runs, results, strict=True) if g.draft == drafts["never"]
    )


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
