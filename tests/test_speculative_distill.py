"""Tests of the distilled draft (training, safetensors cache) and of adaptive speculation."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hpcnb.speculative.contracts import DraftSpec, StageEvent
from hpcnb.speculative.distill import (
    OPEN_ENDED_PROMPTS,
    DistillError,
    DistillSettings,
    _greedy,
    _init_draft,
    batched_greedy,
    corpus_prompts,
    distill_draft,
    draft_cache_path,
    load_draft,
    load_or_distill,
    save_draft,
)
from hpcnb.speculative.drafts import DistilledDraftSpec, ModelDraft, measure_acceptance
from hpcnb.speculative.head import ADAPT_PROBE_EVERY, HeadPolicy
from hpcnb.speculative.model import LlamaModel, tiny_config
from hpcnb.speculative.simulation import ClusterConfig, simulate

SETTINGS = DistillSettings(
    n_layers=1,
    dim=32,
    ffn_dim=64,
    n_heads=2,
    n_kv_heads=1,
    n_new=24,
    steps=150,
    batch=16,
    lr=1e-2,
    vocab=96,
)


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel.random(tiny_config(), seed=2)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(96) for _ in range(rng.randrange(3, 12))] for _ in range(n)]


def _pooled_acceptance(draft: ModelDraft, target: LlamaModel, prompts: list[list[int]]) -> float:
    refs = batched_greedy(target, prompts, 24)
    acc = dra = 0.0
    for p, ref in zip(prompts, refs, strict=True):
        m = measure_acceptance(draft, p, ref, k=4)
        acc, dra = acc + m["accepted"], dra + m["drafted"]
    return acc / dra


@pytest.fixture(scope="module")
def trained(target: LlamaModel):
    return distill_draft(target, _prompts(128, seed=0), SETTINGS)


def test_batched_greedy_equals_one_prompt_at_a_time(target: LlamaModel) -> None:
    prompts = [[1, 5, 9, 3, 7, 5, 9, 3], [4, 8, 15], [2, 2, 2, 2, 2, 7]]
    out, labels = _greedy(target, prompts, 12, 2, prompt_labels=True)
    assert out == [target.greedy(p, 12) for p in prompts]
    assert batched_greedy(target, prompts, 12, batch=2) == out
    assert [len(x) for x in labels] == [8, 3, 6] and labels[1][-1] == out[1][0]
    with pytest.raises(DistillError, match="at least one token"):
        batched_greedy(target, [[1], []], 2)


def test_training_reduces_loss_and_raises_held_out_acceptance(target, trained) -> None:
    loss = trained.meta["loss"]
    assert sum(loss[-10:]) / 10 < 0.5 * sum(loss[:10]) / 10
    held_out = _prompts(16, seed=1)  # different prompts from training
    untrained = _init_draft(target, SETTINGS.config(target.config), range(96), SETTINGS.seed)
    a_trained = _pooled_acceptance(ModelDraft(trained.model, vocab=trained.vocab), target, held_out)
    a_untrained = _pooled_acceptance(ModelDraft(untrained, vocab=range(96)), target, held_out)
    assert a_trained > a_untrained + 0.02
    assert 0.0 < trained.meta["vocab_coverage"] <= 1.0


def test_draft_forward_matches_the_decoder(trained) -> None:
    """The batched training forward and LlamaModel's forward are the same function."""
    from hpcnb.speculative.distill import _final, _hidden, _rms

    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    h = _hidden(trained.model, torch.tensor([ids]), torch.arange(8)[None], None)
    norm, head = _final(trained.model)
    batched = _rms(h[0], norm, 1e-5) @ head.T
    assert torch.allclose(batched, trained.model.forward(ids), atol=1e-4)


def test_cache_round_trip_and_hash_mismatch_retrains(
    target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    small = DistillSettings(
        n_layers=1,
        dim=32,
        ffn_dim=64,
        n_heads=2,
        n_kv_heads=1,
        n_new=4,
        steps=3,
        batch=4,
        vocab=64,
    )
    prompts = _prompts(6, seed=3)
    first = load_or_distill(target, "hash-a", prompts, small)
    assert first.meta["cached"] is False and Path(first.meta["path"]).suffix == ".safetensors"
    assert Path(first.meta["path"]).parent.parent == tmp_path
    again = load_or_distill(target, "hash-a", prompts, small)
    assert again.meta["cached"] is True and again.vocab == first.vocab
    before, after = first.model.layers[0].__dict__, again.model.layers[0].__dict__
    assert all(torch.equal(before[name], after[name]) for name in before)
    ctx = prompts[0]
    assert ModelDraft(again.model, vocab=again.vocab).propose(ctx, 3) == ModelDraft(
        first.model, vocab=first.vocab
    ).propose(ctx, 3)
    # another target file: another key; a file stored under the old key is not reused
    path_b = draft_cache_path("hash-b", small)
    assert path_b != Path(first.meta["path"])
    path_b.write_bytes(Path(first.meta["path"]).read_bytes())  # a stale file at the new name
    other = load_or_distill(target, "hash-b", prompts, small)
    assert other.meta["cached"] is False and other.meta["target_sha256"] == "hash-b"
    assert load_draft(path_b).meta["key"] == other.meta["key"] != first.meta["key"]
    with pytest.raises(DistillError, match="trained for key"):
        load_draft(first.meta["path"], expect_key=other.meta["key"])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(DistillError, match=r"bad\.safetensors"):
        load_draft(bad)
    with pytest.raises(FileNotFoundError):
        load_draft(tmp_path / "absent.safetensors")


def test_distilled_draft_spec_builds_from_its_file(trained, tmp_path: Path) -> None:
    path = save_draft(tmp_path / "d.safetensors", trained)
    spec = DraftSpec.from_json({"kind": "distilled", "path": str(path)})
    assert spec == DistilledDraftSpec(str(path)) and spec.head_layers() == 0
    draft = spec.build(None)
    ref = ModelDraft(trained.model, vocab=trained.vocab).propose([1, 2, 3], 4)
    assert draft.propose([1, 2, 3], 4) == ref
    never = DistilledDraftSpec(str(path), shift=1).build(None)
    assert never.propose([1, 2, 3], 4) == [(t + 1) % 96 for t in ref]


def test_corpus_prompts_keep_held_out_passages_apart() -> None:
    from hpcnb.data import text_corpus

    text = text_corpus(max_chars=60_000)
    train = corpus_prompts(text, 20, seed=0)
    held = corpus_prompts(text, 10, held_out=True, seed=0)
    assert len(set(train)) == 20 and len(held) == 10
    assert not set(train) & set(held) and not set(train) & set(OPEN_ENDED_PROMPTS)
    with pytest.raises(DistillError, match="usable passages"):
        corpus_prompts(text[:2000], 50)


def test_corpus_chats_use_training_passages_only() -> None:
    from hpcnb.data import text_corpus
    from hpcnb.speculative.distill import _passages, corpus_chats

    text = text_corpus(max_chars=60_000)
    passages = _passages(text)
    train = {p for i, p in enumerate(passages) if i % 5 != 4}
    held = {p for i, p in enumerate(passages) if i % 5 == 4} - train  # repeated docstrings
    chats = corpus_chats(text, 12, seed=0)
    assert len(chats) == 12 and chats == corpus_chats(text, 12, seed=0)
    for user, reply in chats:
        assert not any(p in user for p in held)
        assert not any(p in reply for p in held)
        assert sum(p in reply for p in train) >= 2
    with pytest.raises(DistillError, match="training passages"):
        corpus_chats(text[:3000], 50)


def test_tokenizer_chat_wraps_prompt_and_reply() -> None:
    from hpcnb.speculative import BPETokenizer

    toks = ["<|im_start|>", "<|im_end|>", "u", "s", "e", "r", "a", "i", "t", "n", "\n", "Ċ"]
    toks += ["h", "o", "Ġ", "x"]
    tok = BPETokenizer(toks, [], control=[0, 1])
    ids = tok.chat("x", "ho")
    assert ids[: len(tok.chat_prompt("x"))] == tok.chat_prompt("x")
    assert tok.decode(ids).endswith("ho<|im_end|>")


class _Scripted:
    """A draft that is right at the positions of ``right`` and wrong elsewhere."""

    name = "scripted"

    def __init__(self, truth: list[int], right: set[int]) -> None:
        self.truth, self.right = truth, right

    def propose(self, context: list[int], k: int) -> list[int]:
        n = len(context)
        return [
            self.truth[i] if i in self.right else -1 for i in range(n, min(n + k, len(self.truth)))
        ]


def _run_in_process(pol: HeadPolicy, truth: list[int]) -> HeadPolicy:
    """Execute a policy against known greedy tokens, one run at a time."""
    while not pol.done or pol.inflight:
        run = None if pol.done else pol.next_run()
        if run is None:
            rid, r = next(iter(pol.inflight.items()))
            ends = [r.parent_len + i + 1 for i in range(len(r.tokens))]
            out = [truth[q] if r.assumed[:q] == truth[:q] else -7 for q in ends]
            pol.on_result(rid, None if r.cancelled else out)
    return pol


def test_adaptive_rule_on_a_scripted_acceptance_sequence() -> None:
    """Right for 20 tokens, wrong for 40, right again: k falls to 0, probes, recovers."""
    n_new, prompt = 100, [0]
    truth = list(range(1, 1 + n_new + 8))
    right = set(range(1, 21)) | set(range(61, 200))
    pol = _run_in_process(
        HeadPolicy("speculative", truth[:1], n_new, _Scripted(truth, right), k=4, adaptive=True),
        truth,
    )
    assert pol.generated() == truth[1 : 1 + n_new]
    ks = pol.k_history
    assert ks[0] == 2  # prior 0.5: 0.5**2 >= 0.2 > 0.5**3
    first_zero = ks.index(0)
    zeros = ks[first_zero:]
    # after the run of rejections: plain runs, one probe token after ADAPT_PROBE_EVERY of
    # them, the wait doubling after each rejected probe
    probes = [i for i, k in enumerate(zeros[: 4 * ADAPT_PROBE_EVERY]) if k == 1]
    assert probes[:2] == [ADAPT_PROBE_EVERY, ADAPT_PROBE_EVERY + 1 + 2 * ADAPT_PROBE_EVERY]
    # recovered once right again (the last run is cut by the tokens left)
    assert ks[-2] == 4 and pol.acceptance_estimate > 0.7
    fixed = _run_in_process(
        HeadPolicy("speculative", list(prompt), n_new, _Scripted(truth, right), k=4), truth
    )
    assert max(fixed.k_history) == 4 and 0 not in fixed.k_history  # the rule is off


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_adaptive_never_accepted_draft_within_5_percent_of_pipeline(strategy: str) -> None:
    cl = ClusterConfig(
        n_ranks=2,
        n_layers=30,
        layer_s=3e-3,
        batch_slope=0.3,
        head_s=20e-3,
        draft_s=8e-3,
        latency_s=1e-4,
    )
    pipe = simulate(cl, "pipeline", 0.0, n_new=96)
    fixed = simulate(cl, strategy, 0.0, n_new=96, k=4, max_inflight=4, plain_drafts=True)
    adaptive = simulate(
        cl, strategy, 0.0, n_new=96, k=4, max_inflight=4, plain_drafts=True, adaptive=True
    )
    assert adaptive.tokens_per_s >= 0.95 * pipe.tokens_per_s
    assert fixed.tokens_per_s < 0.95 * pipe.tokens_per_s  # without the rule it is slower
    assert adaptive.accepted == 0


def test_simulator_reproduces_hand_computed_timelines() -> None:
    """2 ranks of 1 layer each (1 s per layer, head 0.5 s per token); a token's hidden state
    takes 0.1 s on the link plus 0.1 s latency; results 0.1 s back."""
    cl = ClusterConfig(
        n_ranks=2,
        n_layers=2,
        layer_s=1.0,
        batch_slope=0.5,
        head_s=0.5,
        draft_s=0.2,
        latency_s=0.1,
        bandwidth_bps=1e3,
        hidden_bytes=100,
    )
    pipe = simulate(cl, "pipeline", 0.0, n_new=3, prompt_len=1)
    # run r: head [2.8 r, 2.8 r + 1], arrive +0.2, rank 1 for 1 + 0.5, result +0.1
    expect = []
    for r in range(3):
        t = 2.8 * r
        expect += [
            StageEvent(0, r, "compute", t, t + 1.0, 1, False),
            StageEvent(1, r, "compute", t + 1.2, t + 2.7, 1, False),
        ]
    _same_events(pipe.events, expect)
    assert pipe.elapsed_s == pytest.approx(8.4) and pipe.ttft_s == pytest.approx(2.8)
    # speculative, every draft right, k = 2: 3 tokens per run, 3 committed per run
    spec = simulate(cl, "speculative", 1.0, n_new=9, prompt_len=1, k=2)
    # head: 2 drafts (0.4) + 1 layer at 3 tokens (1 + 0.5 * 2) = 2.4; link 0.3 + 0.1;
    # rank 1: 2.0 + head 1.5 = 3.5; result 0.1: a run every 6.4 s
    expect = []
    for r in range(3):
        t = 6.4 * r
        expect += [
            StageEvent(0, r, "compute", t, t + 2.4, 3, True),
            StageEvent(1, r, "compute", t + 2.8, t + 6.3, 3, True),
        ]
    _same_events(spec.events, expect)
    assert spec.elapsed_s == pytest.approx(19.2) and spec.tokens_per_s == pytest.approx(9 / 19.2)
    assert spec.accepted == spec.drafted == 6
    # a measured head batch cost replaces the per-token head: 0.5 * (1 + 0.2 * 2) at 3 tokens
    measured = replace(cl, head_batch_slope=0.2)
    assert measured.stage_s(1, 3) == pytest.approx(2.0 + 0.7) and cl.stage_s(1, 3) == 3.5
    assert replace(cl, run_overhead_s=0.25).stage_s(0, 1) == pytest.approx(1.25)


def _same_events(got: tuple[StageEvent, ...], expect: list[StageEvent]) -> None:
    def key(e: StageEvent) -> tuple[float, int]:
        return (e.t0, e.rank)

    got_s, exp_s = sorted(got, key=key), sorted(expect, key=key)
    assert len(got_s) == len(exp_s)
    for g, e in zip(got_s, exp_s, strict=True):
        got_key = (g.rank, g.run_id, g.kind, g.n_tokens, g.speculative)
        assert got_key == (e.rank, e.run_id, e.kind, e.n_tokens, e.speculative)
        assert g.t0 == pytest.approx(e.t0) and g.t1 == pytest.approx(e.t1)


def test_copy_layers_variant_keeps_the_target_embeddings(target: LlamaModel) -> None:
    s = DistillSettings(copy_layers=(0, 3), n_new=4, steps=2, batch=2, vocab=50)
    draft = distill_draft(target, _prompts(4, seed=5), s)
    cfg = draft.model.config
    assert (cfg.n_layers, cfg.dim, cfg.ffn_dim) == (2, target.config.dim, target.config.ffn_dim)
    assert torch.equal(draft.model.embedding, target.embedding)  # frozen, not trained
    assert draft.model.output.shape == (len(draft.vocab), target.config.dim)
    with pytest.raises(DistillError, match="copy_layers"):
        DistillSettings(copy_layers=(7,)).config(target.config)
