"""Tests of the feature-level draft head: extraction, training, drafting, cache, head policy."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcnb.speculative.contracts import DraftSpec
from hpcnb.speculative.distill import DistillError, _final, _rms
from hpcnb.speculative.drafts import measure_acceptance
from hpcnb.speculative.feature import (
    FeatureDraftSettings,
    FeatureHead,
    teacher_forced_accuracy,
    train_feature_draft,
)
from hpcnb.speculative.feature_cache import (
    feature_draft_cache_path,
    load_feature_draft,
    load_or_train_feature_draft,
    save_feature_draft,
)
from hpcnb.speculative.feature_draft import CascadeDraft, FeatureDraft, FeatureDraftSpec
from hpcnb.speculative.features import extract_features, greedy_features, target_features
from hpcnb.speculative.head import HeadPolicy
from hpcnb.speculative.model import LlamaModel, tiny_config

VOCAB = 64


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel.random(tiny_config(n_layers=3, vocab_size=VOCAB), seed=4)


def _greedy_seqs(target: LlamaModel, n: int, seed: int, n_new: int = 24) -> list[list[int]]:
    """Prompts followed by the target's greedy continuation (what a draft must predict)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 9))]
        out.append(prompt + target.greedy(prompt, n_new))
    return out


@pytest.fixture(scope="module")
def data(target: LlamaModel) -> dict[str, list[list[int]]]:
    return {"train": _greedy_seqs(target, 48, seed=1), "held": _greedy_seqs(target, 12, seed=2)}


SETTINGS = FeatureDraftSettings(vocab=VOCAB, steps=120, batch=16, lr=3e-3, noise=0.05, seed=0)


@pytest.fixture(scope="module")
def trained(target: LlamaModel, data):
    return train_feature_draft(target, data["train"], SETTINGS)


def test_extraction_equals_the_targets_own_hidden_states(target: LlamaModel) -> None:
    seqs = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [5, 5, 5, 1], [3] * 11]
    out = extract_features(target, seqs, top_k=4, batch_tokens=20)  # several padded batches
    norm, head = _final(target)
    for seq, x in zip(seqs, out, strict=True):
        assert x.tokens.tolist() == seq
        own = target.run_layers(target.embed(seq))
        assert torch.allclose(x.features, own, atol=1e-4, rtol=1e-4)
        probs = torch.softmax(_rms(own, norm, target.config.norm_eps) @ head.T, -1)
        assert x.top_ids[:, 0].tolist() == probs.argmax(-1).tolist()
        assert torch.allclose(x.top_p[:, 0], probs.max(-1).values, atol=1e-5)
        assert torch.allclose(target_features(target, seq), own)
    with pytest.raises(DistillError, match="at least one token"):
        extract_features(target, [[1, 2], []])


def test_greedy_features_equal_a_teacher_forced_pass(target: LlamaModel) -> None:
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [5]]
    got = greedy_features(target, prompts, 6, top_k=3, batch=2)
    for p, x in zip(prompts, got, strict=True):
        cont = target.greedy(p, 6)
        assert x.tokens.tolist() == p + cont[:-1]
        assert x.top_ids[len(p) - 1 :, 0].tolist() == cont  # labels: the generated tokens
        again = extract_features(target, [x.tokens.tolist()], top_k=3)[0]
        assert torch.allclose(x.features, again.features, atol=1e-4, rtol=1e-4)
        assert torch.allclose(x.top_p, again.top_p, atol=1e-5)
    with pytest.raises(DistillError, match="n_new"):
        greedy_features(target, prompts, 0)


def test_training_beats_an_untrained_head(target: LlamaModel, data, trained) -> None:
    held = extract_features(target, data["held"])
    untrained = train_feature_draft(target, data["train"], replace(SETTINGS, steps=1, lr=1e-9))
    hits, rows = teacher_forced_accuracy(trained.head, target, held)
    hits0, rows0 = teacher_forced_accuracy(untrained.head, target, held)
    assert rows == rows0 == sum(len(s) - 1 for s in data["held"])
    assert hits / rows > hits0 / rows0 + 0.1, (hits / rows, hits0 / rows0)
    assert trained.meta["loss"][-1] < trained.meta["loss"][0]
    assert trained.meta["vocab_coverage"] == 1.0 and trained.meta["tokens"] > 0


def test_unrolled_pass_reads_the_heads_own_predictions(target: LlamaModel, data) -> None:
    """The second pass's loss depends on the first pass's predicted features: with unroll=2
    the gradient reaches the first pass through them (unroll=1 trains another head)."""
    one = train_feature_draft(target, data["train"][:8], replace(SETTINGS, steps=2, unroll=1))
    two = train_feature_draft(target, data["train"][:8], replace(SETTINGS, steps=2, unroll=2))
    assert not torch.equal(one.head.fc, two.head.fc)
    # the forward with `past` attends to the earlier pass's rows < t and to itself
    head = two.head
    E = target.embedding
    x = extract_features(target, data["train"][:1])[0]
    n = len(x.tokens) - 1
    pos = torch.arange(n)[None]
    feats, nxt = x.features[None, :n], x.tokens[None, 1:]
    out, kv = head.forward(E, feats, nxt, pos)
    shifted = torch.cat([feats[:, :1], out[:, :-1]], dim=1)
    out2, _ = head.forward(E, shifted, nxt, pos, kv)
    # row 3 of the unrolled pass equals a drafter that saw true features for rows 0..2 and
    # its own prediction at row 3
    draft = FeatureDraft.from_target(head, target)
    draft.observe(x.tokens.tolist(), 0, x.features[:3])
    assert draft._rows_for(x.tokens[:5].tolist())  # rows 0..3, row 3 reads a prediction
    assert draft._row_true == [True, True, True, False]
    assert torch.allclose(draft._outs[3], out2[0, 3], atol=1e-4)


def test_drafting_equals_the_batched_head_and_extends_chains(target, trained) -> None:
    seq = _greedy_seqs(target, 1, seed=9, n_new=16)[0]
    feats = target_features(target, seq)
    draft = FeatureDraft.from_target(trained.head, target)
    assert draft.propose(seq[:6], 3) == []  # no feature yet: nothing to draft from
    draft.observe(seq, 0, feats[:5])
    d = draft.propose(seq[:6], 4)
    assert len(d) == 4
    # the first token is the head's argmax on true features of rows 0..4
    norm, head = _final(target)
    out, _ = trained.head.forward(
        target.embedding, feats[None, :5], torch.tensor([seq[1:6]]), torch.arange(5)[None]
    )
    vocab = torch.tensor(trained.head.vocab)
    first = int(vocab[(_rms(out[0, -1], norm, 1e-5) @ head[vocab].T).argmax()])
    assert d[0] == first
    # chaining on its own unverified tokens gives what one longer proposal gives
    fresh = FeatureDraft.from_target(trained.head, target)
    fresh.observe(seq, 0, feats[:5])
    longer = fresh.propose(seq[:6], 6)
    again = FeatureDraft.from_target(trained.head, target)
    again.observe(seq, 0, feats[:5])
    a = again.propose(seq[:6], 3)
    b = again.propose(seq[:6] + a, 3)
    assert a + b == longer
    # true features replace predictions: the rows are recomputed
    again.observe(seq, 0, feats[:9])
    again.propose(seq[:10], 2)
    assert again._row_true[:9] == [True] * 9
    never = FeatureDraft.from_target(trained.head, target, shift=1)
    never.observe(seq, 0, feats[:5])
    assert never.propose(seq[:6], 4) == [(t + 1) % VOCAB for t in d]


def test_observe_checks_width_and_positions(target, trained) -> None:
    draft = FeatureDraft.from_target(trained.head, target)
    with pytest.raises(Exception, match=r"features must be \(m, 64\)"):
        draft.observe([1, 2, 3], 0, torch.zeros(2, 10))
    with pytest.raises(Exception, match="need 5 tokens"):
        draft.observe([1, 2, 3], 2, torch.zeros(3, 64))
    draft.observe([1, 2, 3, 4], 0, torch.ones(4, 64))
    draft.observe([1, 2, 9, 9], 3, torch.ones(1, 64))  # a gap after the changed prefix
    assert draft.known() == 2


def test_head_policy_passes_verified_features_and_checks_the_message(target, trained) -> None:
    seq = _greedy_seqs(target, 1, seed=5, n_new=20)[0]
    prompt, ref = seq[:6], seq[6:]
    feats = target_features(target, seq)
    draft = FeatureDraft.from_target(trained.head, target)
    pol = HeadPolicy("speculative", prompt, 12, draft=draft, k=3)
    run = pol.next_run()
    assert run is not None and run.tokens == prompt  # no features yet: no drafts
    with pytest.raises(Exception, match="expected"):
        pol.on_result(run.run_id, ref[:1] * len(run.tokens), features=np.zeros((2, 64)), start=0)
    with pytest.raises(Exception, match="from position"):
        pol.on_result(
            run.run_id, [0] * len(run.tokens), features=np.zeros((len(run.tokens), 64)), start=1
        )
    full = prompt + ref
    r = run
    while r is not None:
        lo = r.parent_len
        outs = [full[q + 1] if q + 1 < len(full) else 0 for q in range(lo, lo + len(r.tokens))]
        # the outputs of a wrong draft token are still the target's argmax given that token;
        # only outputs whose prefix is committed matter for verification
        pol.on_result(r.run_id, outs, features=feats[lo : lo + len(r.tokens)].numpy(), start=lo)
        assert draft.known() <= len(pol.committed) - 1
        r = pol.next_run()
    assert pol.generated() == ref[:12]
    assert draft.known() >= len(prompt)
    assert pol.drafted > 0


def test_replay_with_features_and_cascade_counts_sources(target, trained, data) -> None:
    seq = data["held"][0]
    prompt, ref = seq[:6], seq[6:]
    feats = target_features(target, seq)
    m = measure_acceptance(
        FeatureDraft.from_target(trained.head, target), prompt, ref, k=3, features=feats
    )
    assert m["drafted"] > 0 and 0 <= m["accepted"] <= m["drafted"]
    without = measure_acceptance(FeatureDraft.from_target(trained.head, target), prompt, ref, 3)
    assert without["drafted"] == 0  # no features: the draft never proposes
    rep = [1, 2, 3, 4, 5, 1, 2, 3]
    cascade = CascadeDraft(FeatureDraft.from_target(trained.head, target), min_n=3)
    assert cascade.propose(rep, 2) == [4, 5] and cascade.last_source == "ngram"
    cascade.observe(seq, 0, feats[:5])
    assert cascade.propose(seq[:6], 2) and cascade.last_source == "feature"
    c = measure_acceptance(
        CascadeDraft(FeatureDraft.from_target(trained.head, target)), prompt, ref, 3, features=feats
    )
    sources = {k.split(".")[0] for k in c if "." in k}
    assert sources <= {"ngram", "feature"} and sources
    assert sum(c[f"{s}.drafted"] for s in sources) == c["drafted"]
    assert sum(c[f"{s}.accepted"] for s in sources) == c["accepted"]


def test_cache_round_trip_and_spec(target, data, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    small = replace(SETTINGS, steps=3)
    first = load_or_train_feature_draft(target, "hash-a", data["train"][:6], small, data_key="d")
    assert first.meta["cached"] is False
    again = load_or_train_feature_draft(target, "hash-a", data["train"][:6], small, data_key="d")
    assert again.meta["cached"] is True and again.head.vocab == first.head.vocab
    for name, t in first.head.tensors().items():
        assert torch.equal(t, again.head.tensors()[name]), name
    assert again.head.scale == first.head.scale
    other = feature_draft_cache_path("hash-b", small, "d")
    assert other != Path(first.meta["path"])
    other.write_bytes(Path(first.meta["path"]).read_bytes())  # stale file under the new key
    with pytest.warns(Warning, match="trained again"):
        retrained = load_or_train_feature_draft(
            target, "hash-b", data["train"][:6], small, data_key="d"
        )
    assert retrained.meta["cached"] is False
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(DistillError, match=r"bad\.safetensors"):
        load_feature_draft(bad)
    path = save_feature_draft(tmp_path / "f.safetensors", first)
    spec = DraftSpec.from_json({"kind": "feature", "path": str(path), "ngram_first": True})
    assert spec == FeatureDraftSpec(str(path), ngram_first=True) and spec.needs_features()
    built = spec.build(target)
    assert isinstance(built, CascadeDraft) and isinstance(built.second, FeatureDraft)
    with pytest.raises(Exception, match="head's model"):
        FeatureDraftSpec(str(path)).build(None)
    assert isinstance(first.head, FeatureHead)
