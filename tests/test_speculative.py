"""Tests of hpcnb.speculative: decoder, KV cache, GGUF loading, drafts and head policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcnb.speculative import (
    GGUFFormatError,
    HeadPolicy,
    KVCache,
    LlamaModel,
    NgramDraft,
    early_exit_draft,
    load_gguf,
    measure_acceptance,
)
from hpcnb.speculative.gguf_loader import smollm2_path
from hpcnb.speculative.model import tiny_config


@pytest.fixture(scope="module")
def tiny() -> LlamaModel:
    return LlamaModel.random(tiny_config(), seed=2)


PROMPT = [1, 5, 9, 3, 7, 5, 9, 3]


def test_kv_cache_copy_truncate_remove() -> None:
    c = KVCache((0, 1))
    k = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    for layer in (0, 1):
        c.put(7, layer, k, -k)
    assert c.length(7) == 5 and c.has(7)
    c.copy(7, 8, 3)
    assert c.length(8) == 3 and c.length(7) == 5
    assert torch.equal(c.get(8, 1)[1], -k[:, :3])
    c.truncate(7, 2)
    assert c.length(7) == 2 and c.length(8) == 3
    c.remove(7)
    assert not c.has(7) and c.seq_ids() == [8]
    with pytest.raises(KeyError):
        c.copy(7, 9)
    with pytest.raises(ValueError, match="length 4 > length 3"):
        c.copy(8, 9, 4)
    with pytest.raises(KeyError):
        c.put(8, 5, k, k)


def test_cache_matches_recompute(tiny: LlamaModel) -> None:
    cache = tiny.new_cache()
    tiny.forward(PROMPT[:5], 0, cache)
    inc = tiny.forward(PROMPT[5:], 0, cache)[-1]
    full = tiny.forward(PROMPT, 0, None)[-1]
    assert torch.allclose(inc, full, atol=1e-4)
    assert tiny.greedy(PROMPT, 32, use_cache=True) == tiny.greedy(PROMPT, 32, use_cache=False)


def test_cache_sequences_are_independent(tiny: LlamaModel) -> None:
    cache = tiny.new_cache()
    tiny.forward(PROMPT, 0, cache)
    cache.copy(0, 1, 4)
    a = tiny.forward(PROMPT[4:], 1, cache)[-1]
    cache.truncate(0, 4)
    b = tiny.forward(PROMPT[4:], 0, cache)[-1]
    assert torch.allclose(a, b, atol=1e-5)
    assert cache.length(0) == cache.length(1) == len(PROMPT)


def test_drafts_and_acceptance(tiny: LlamaModel) -> None:
    ref = tiny.greedy(PROMPT, 24)
    full = early_exit_draft(tiny, tiny.config.n_layers)
    assert full.propose(PROMPT, 4) == ref[:4]  # all layers = the target itself
    assert measure_acceptance(full, PROMPT, ref, 4)["acceptance_rate"] == 1.0
    part = measure_acceptance(early_exit_draft(tiny, 1), PROMPT, ref, 4)
    assert 0.0 <= part["acceptance_rate"] < 1.0
    assert part["accepted"] == pytest.approx(part["acceptance_rate"] * part["drafted"])
    assert NgramDraft().propose([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]
    assert NgramDraft().propose([4, 5, 6], 3) == []


class _Oracle:
    """A draft that proposes the known greedy tokens, wrong at chosen positions."""

    name = "oracle"

    def __init__(self, truth: list[int], wrong: set[int]) -> None:
        self.truth, self.wrong = truth, wrong

    def propose(self, context: list[int], k: int) -> list[int]:
        n = len(context)
        return [
            (self.truth[i] + 1) % 50 if i in self.wrong else self.truth[i]
            for i in range(n, min(n + k, len(self.truth)))
        ]


@pytest.mark.parametrize("strategy", ["pipeline", "speculative", "pipeinfer"])
def test_policy_lossless_in_process(tiny: LlamaModel, strategy: str) -> None:
    """Drive HeadPolicy with a one-stage executor: every strategy gives greedy tokens."""
    ref = tiny.greedy(PROMPT, 20)
    truth = PROMPT + ref
    pol = HeadPolicy(strategy, PROMPT, 20, _Oracle(truth, {12, 13, 19}), k=3, max_inflight=3)
    cache = tiny.new_cache()
    queue = []
    while not pol.done or pol.inflight:
        run = None if pol.done else pol.next_run()
        if run is not None:
            if run.seq != run.parent_seq:
                cache.copy(run.parent_seq, run.seq, run.parent_len)
            logits = tiny.forward(run.tokens, run.seq, cache)
            queue.append((run.run_id, torch.argmax(logits, -1).tolist()))
            continue
        rid, out = queue.pop(0)
        cancelled = pol.inflight[rid].cancelled
        edits, _ = pol.on_result(rid, None if cancelled else out)
        for e in edits:
            if e[0] == "commit":
                cache.copy(e[1], 0, e[2])
            else:
                cache.remove(e[1])
    assert pol.generated() == ref
    if strategy == "pipeinfer":
        assert pol.n_cancelled > 0


def test_smollm2_loads_and_is_cache_consistent() -> None:
    try:
        path = smollm2_path()
    except FileNotFoundError as err:
        pytest.skip(f"SmolLM2 GGUF absent: {err}")
    model, tok = load_gguf(path, layers=(0, 2))
    ids = tok.encode("Hello world, 123!")
    assert tok.decode(ids) == "Hello world, 123!"
    assert model.config.dim == 576 and len(model.layers) == 2
    cache = model.new_cache()
    model.forward(ids[:3], 0, cache)
    inc = model.forward(ids[3:], 0, cache)[-1]
    assert torch.allclose(inc, model.forward(ids, 0, None)[-1], atol=1e-4)


def test_corrupt_and_truncated_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        load_gguf(bad)
    hdr = tmp_path / "hdr.gguf"
    hdr.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 40)
    with pytest.raises(GGUFFormatError, match=r"hdr\.gguf"):
        load_gguf(hdr)
    try:
        src = smollm2_path()
    except FileNotFoundError:
        return
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(8_000_000))
    with pytest.raises(GGUFFormatError, match="truncated"):
        load_gguf(cut)


def test_simulation_lossless_cancellation_and_trends() -> None:
    from hpcnb.speculative.simulation import ClusterConfig, simulate, sweep

    cl = ClusterConfig(n_ranks=4, n_layers=8, layer_s=1e-3, head_s=1e-3, draft_s=1e-3)
    for strategy in ("pipeline", "speculative", "pipeinfer"):
        r = simulate(cl, strategy, 0.6, n_new=40, k=2, max_inflight=6)  # raises if lossy
        assert r.tokens_per_s > 0 and r.itl_mean_s > 0
    pi = simulate(cl, "pipeinfer", 0.4, n_new=40, k=2, max_inflight=8)
    assert pi.cancelled_runs > 0 and sum(pi.skipped) > 0
    # a perfect draft on a deep pipeline: PipeInfer beats synchronous speculation
    rows = sweep(cl, [1.0], n_new=40, ks=(2, 4), pipeinfer_ks=(2,), n_ranks=8)
    assert rows[0]["pipeinfer_vs_speculative"] > 1.0
    with pytest.raises(ValueError, match="n_ranks"):
        ClusterConfig(n_ranks=1)


def test_toy_tokenizer_and_balanced_split() -> None:
    from hpcnb.speculative import BPETokenizer
    from hpcnb.speculative.stages import balanced_split

    toks = ["<|end|>", "a", "b", "Ġ", "ab", "Ġab", "1", "2"]
    tok = BPETokenizer(toks, ["a b", "Ġ ab"], control=[0])
    ids = tok.encode("ab ab12<|end|>")
    assert ids == [4, 5, 6, 7, 0]
    assert tok.decode(ids) == "ab ab12<|end|>"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("c")
    with pytest.raises(ValueError, match="left right"):
        BPETokenizer(toks, ["abc"])
    split = balanced_split(30, 2, layer_s=1.0, head_s=4.0, batch=1)
    assert split == [[0, 17], [17, 30]]
    assert balanced_split(4, 4, 1.0, 100.0) == [[0, 1], [1, 2], [2, 3], [3, 4]]


def test_paired_ratios_and_relative_error() -> None:
    from hpcnb.speculative.analysis import paired_ratios, relative_error_interval, worst_error
    from hpcnb.stats import Estimate

    results = [{"tokens_per_s": v} for v in (10.0, 20.0, 12.0, 30.0)]
    labels = ["a", "b", "a", "b"]
    assert paired_ratios(results, labels, "b", "a") == [2.0, 2.5]
    with pytest.raises(ValueError, match="same, non-zero number"):
        paired_ratios(results[:3], labels[:3], "b", "a")
    with pytest.raises(ValueError, match="labels"):
        paired_ratios(results, labels[:2], "b", "a")
    # prediction 1.2 against samples around 1.0: error 0.2, interval from the samples' spread
    e = relative_error_interval(1.2, [0.9, 1.0, 1.1, 1.0, 1.0])
    assert isinstance(e, Estimate) and e.n == 5 and e.coverage == pytest.approx(0.9375)
    assert e.value == pytest.approx(0.2)
    assert e.bounds[0] <= e.value <= e.bounds[1]
    # a prediction inside the measured interval: the interval reaches zero error
    inside = relative_error_interval(1.0, [0.8, 1.2, 0.9, 1.1, 1.0])
    assert inside.value == 0.0 and inside.low == 0.0 and inside.bounds[1] > 0.0
    # one sample: an error without an interval
    assert relative_error_interval(1.5, [1.0]) == Estimate(0.5, n=1)
    with pytest.raises(ValueError, match="positive"):
        relative_error_interval(1.0, [1.0, -1.0])
    # the worst of several: the largest value, the largest ends of the intervals
    worst = worst_error([e, inside])
    assert worst.value == e.value and worst.interval == (e.low, max(e.bounds[1], inside.bounds[1]))
    assert worst.n == 5 and worst.coverage == e.coverage
    assert worst_error([e, Estimate(0.3, n=5)]) == Estimate(0.3, n=5)


def test_paper_scale_cluster_cpu_and_gpu_class() -> None:
    from hpcnb.speculative.analysis import LAYER_BYTES_70B_Q4, paper_scale_cluster

    meas = {"layer_s": 1e-3, "layer_bytes": 1e7, "batch_slope": 0.8, "head_s": 1e-3}
    cpu = paper_scale_cluster(meas, n_ranks=8)
    assert cpu.layer_s == pytest.approx(LAYER_BYTES_70B_Q4 / 1e10)
    assert cpu.batch_slope == 0.5  # capped
    gpu = paper_scale_cluster(meas, n_ranks=8, layer_s=50e-6, batch_slope=0.0)
    assert gpu.layer_s == pytest.approx(50e-6) and gpu.batch_slope == 0.0
    # draft and head scale with the same memory bandwidth as the layers
    assert gpu.draft_s / gpu.layer_s == pytest.approx(cpu.draft_s / cpu.layer_s)
    with pytest.raises(ValueError, match="layer_s"):
        paper_scale_cluster(meas, layer_s=0.0)


def test_simulated_links_keep_message_order() -> None:
    """Fast stages, a slow link and many runs in flight: a 2-token run sent after a
    1-token one must not overtake it (MPI's non-overtaking rule); the run stays lossless."""
    from hpcnb.speculative.simulation import ClusterConfig, simulate

    cl = ClusterConfig(
        n_ranks=8,
        n_layers=80,
        layer_s=50e-6,
        batch_slope=0.0,
        head_s=15e-6,
        draft_s=64e-6,
        latency_s=100e-6,
        bandwidth_bps=125e6,
        hidden_bytes=32768,
    )
    for k, inflight in [(1, 16), (2, 8)]:
        r = simulate(cl, "pipeinfer", 0.3, n_new=48, k=k, max_inflight=inflight)
        assert r.runs < 48 * 20  # no livelock of empty runs


def test_policy_rejects_results_out_of_launch_order(tiny: LlamaModel) -> None:
    pol = HeadPolicy("pipeinfer", PROMPT, 8, NgramDraft(), k=2, max_inflight=3)
    first, second = pol.next_run(), pol.next_run()
    assert first is not None and second is not None
    with pytest.raises(ValueError, match="arrived before"):
        pol.on_result(second.run_id, [0] * len(second.tokens))
    with pytest.raises(KeyError):
        pol.on_result(10_000, [0])


def test_job_spec_json_round_trip_and_defaults() -> None:
    from hpcnb.speculative import (
        EarlyExitDraftSpec,
        GenerationSpec,
        JobSpec,
        NgramDraftSpec,
        TransformerSpec,
    )

    legacy = {
        "model": {"kind": "tiny", "n_layers": 4, "seed": 2},
        "prompt": PROMPT,
        "n_new": 8,
        "k": 3,
        "stage_delay_s": {"1": 0.004},
        "runs": [
            {"strategy": "pipeline", "draft": None},
            {"strategy": "pipeinfer", "draft": {"kind": "early_exit", "layers": 1}},
            {"strategy": "speculative", "draft": {"kind": "ngram"}, "n_new": 4},
        ],
    }
    job = JobSpec.from_json(legacy)
    assert job.model == TransformerSpec("tiny", n_layers=4, seed=2)
    assert [g.strategy for g in job.runs] == ["pipeline", "pipeinfer", "speculative"]
    assert all(g.prompt == tuple(PROMPT) and g.k == 3 for g in job.runs)
    assert job.runs[1].draft == EarlyExitDraftSpec(layers=1)
    assert job.runs[2].draft == NgramDraftSpec() and job.runs[2].n_new == 4
    assert job.stage_delay_s == {1: 0.004} and job.head_layers() == 1
    assert JobSpec.from_json(job.to_json()) == job
    single = JobSpec.from_json(
        {"model": {"kind": "tiny"}, "strategy": "pipeline", "prompt": [1], "n_new": 2}
    )
    assert single.runs == (GenerationSpec("pipeline", [1], 2),)


def test_job_spec_errors_name_the_key() -> None:
    from hpcnb.speculative import JobSpec
    from hpcnb.speculative.contracts import DraftSpec, SpecError

    model = {"kind": "tiny"}
    gen = {"strategy": "pipeline", "prompt": [1], "n_new": 2}
    with pytest.raises(SpecError, match="run 0 lacks 'strategy'"):
        JobSpec.from_json({"model": model, "runs": [{"n_new": 8}]})
    with pytest.raises(SpecError, match="unknown key 'layers'"):
        JobSpec.from_json({"model": {"kind": "tiny", "layers": 2}, **gen})
    with pytest.raises(SpecError, match="the job has unknown key 'timeout'"):
        JobSpec.from_json({"model": model, "timeout": 3, **gen})
    with pytest.raises(SpecError, match="the job lacks 'model'"):
        JobSpec.from_json(gen)
    with pytest.raises(SpecError, match="unknown draft 'medusa'"):
        DraftSpec.from_json({"kind": "medusa", "heads": 4})
    with pytest.raises(SpecError, match="'distilled' lacks 'path'"):
        DraftSpec.from_json({"kind": "distilled"})
    with pytest.raises(SpecError, match="'early_exit' lacks 'layers'"):
        DraftSpec.from_json({"kind": "early_exit"})
    with pytest.raises(SpecError, match="strategy='greedy'"):
        JobSpec.from_json({"model": model, **gen, "strategy": "greedy"})
    with pytest.raises(SpecError, match="fault kind"):
        JobSpec.from_json({"model": model, **gen, "fault": {"rank": 1, "kind": "explode"}})


def test_run_result_and_events_json_round_trip() -> None:
    from hpcnb.speculative import RunResult
    from hpcnb.speculative.contracts import SpecError, StageEvent

    ev = StageEvent(1, 7, "skip", 0.1, 0.2, 3, True)
    res = RunResult(
        "pipeinfer",
        (4, 5),
        2,
        2,
        "ngram",
        1.0,
        2.0,
        0.1,
        0.5,
        0.6,
        0.5,
        4,
        2,
        5,
        1,
        (6, 3),
        (0, 3),
        10,
        (ev,),
    )
    assert RunResult.from_json(res.to_json()) == res
    data = res.to_json()
    del data["ttft_s"]
    with pytest.raises(SpecError, match="run result lacks 'ttft_s'"):
        RunResult.from_json(data)


def test_custom_draft_kind_registers_in_one_place() -> None:
    from dataclasses import dataclass

    from hpcnb.speculative import GenerationSpec
    from hpcnb.speculative.contracts import DRAFTS, DraftSpec, SpecError, register_draft

    @register_draft("test_constant")
    @dataclass(frozen=True)
    class ConstantDraftSpec(DraftSpec):
        token: int = 0

        def build(self, head_model: LlamaModel | None) -> NgramDraft:
            return NgramDraft(max_n=self.token)

    try:
        gen = GenerationSpec.from_json(
            {
                "strategy": "speculative",
                "prompt": [1],
                "n_new": 2,
                "draft": {"kind": "test_constant", "token": 2},
            }
        )
        # defined in a function, so not importable by reference: written by its kind
        assert gen.draft == ConstantDraftSpec(2) and gen.draft.to_json()["kind"] == "test_constant"
        assert GenerationSpec.from_json(gen.to_json()) == gen
        assert DRAFTS.get("test_constant") is ConstantDraftSpec and "test_constant" in DRAFTS
        register_draft("test_constant")(ConstantDraftSpec)  # the same class again: a no-op

        @dataclass(frozen=True)
        class OtherDraftSpec(ConstantDraftSpec):
            pass

        with pytest.raises(SpecError, match="registered already"):
            register_draft("test_constant")(OtherDraftSpec)
        assert DRAFTS.get("test_constant") is ConstantDraftSpec
    finally:
        DRAFTS.unregister("test_constant")
    with pytest.raises(SpecError, match="no name another process can resolve"):
        gen.draft.to_json()


def test_local_cluster_and_simulated_ratios() -> None:
    from hpcnb.speculative.analysis import local_cluster, simulated_ratios
    from hpcnb.speculative.simulation import simulate

    meas = {"layer_s": 1e-3, "batch_slope": 0.1, "head_s": 4e-3, "head_batch_slope": 0.2}
    cfg = local_cluster(meas, [[0, 10], [10, 16]], draft_s=5e-4, dim=64)
    assert (cfg.n_ranks, cfg.n_layers, cfg.layers_per_rank) == (2, 16, (10, 6))
    assert cfg.hidden_bytes == 256 and cfg.draft_s == 5e-4
    strategies = {"pipeline": {"strategy": "pipeline"}, "spec": {"strategy": "speculative", "k": 2}}
    table = simulated_ratios(
        cfg, [0.2, 0.8], strategies, [("spec", "pipeline")], n_new=12, prompt_len=4, seeds=(0,)
    )
    assert list(table.index) == [0.2, 0.8] and list(table.columns) == ["spec / pipeline"]
    spec = simulate(cfg, "speculative", 0.8, n_new=12, prompt_len=4, seed=0, k=2).tokens_per_s
    pipe = simulate(cfg, "pipeline", 0.8, n_new=12, prompt_len=4, seed=0).tokens_per_s
    assert table.loc[0.8, "spec / pipeline"] == pytest.approx(spec / pipe)
    assert table.loc[0.8, "spec / pipeline"] > table.loc[0.2, "spec / pipeline"]
