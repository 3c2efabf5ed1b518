"""Caches under concurrent writers, with damaged files and with folders that cannot be written.

The four measurement caches (Winograd wisdom, the perfmodel timing cache, the distilled
drafts, the pruning latency tables) share the rules of :mod:`hpcnb.cachefile`: private
temporary files and ``os.replace``, merges under a lock, validation on read, and one warning
when the cache cannot be written. Concurrency is tested with real processes started
together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

import hpcnb.perfmodel.dataset as dataset_module
from conftest import REPO
from hpcnb.cachefile import (
    CacheLockError,
    CacheWarning,
    CorruptCacheError,
    best_effort,
    lock_path,
    locked,
    read_json,
    update_json,
    write_private_atomic,
)
from hpcnb.perfmodel import GridConfig, NoisePolicy, TimingConfig, collect_dataset
from hpcnb.speculative.distill import (
    DistillSettings,
    TrainedDraft,
    load_draft,
    load_or_distill,
    save_draft,
)
from hpcnb.speculative.model import LlamaModel, tiny_config
from hpcnb.timing import Timing
from hpcnb.winograd.wisdom import WisdomWarning, read_wisdom, store_entry

CLEAN = [1.00, 1.01, 0.99, 1.00, 1.02]
QUIET = NoisePolicy(max_load_per_core=1e6)  # these tests are about the cache, not noise
ENTRY = {"best": {"m": 2}, "best_s": 1e-3, "default_s": 2e-3, "trials": []}


def _as_dict(data: object) -> dict:
    if not isinstance(data, dict):
        raise CorruptCacheError(f"expected an object, got {type(data).__name__}")
    return data


def _blocked_root(tmp_path: Path) -> Path:
    """A cache root that cannot be created, for root too: its parent is a regular file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder's parent should be\n")
    return blocker / "cache"


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(r.message) for r in record if issubclass(r.category, CacheWarning)]


# -- the shared mechanics ------------------------------------------------------------------


def test_private_atomic_write_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.json"
    assert write_private_atomic(path, "one\n") == path
    write_private_atomic(path, b"two\n")
    assert path.read_bytes() == b"two\n" and path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]
    target = tmp_path / "a-folder"
    target.mkdir()
    with pytest.raises(OSError):
        write_private_atomic(target, "cannot replace a folder")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_lock_excludes_a_second_holder_and_times_out_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with locked(path):
            holding.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert holding.wait(10)
        assert lock_path(path).exists()
        start = time.monotonic()
        with pytest.raises(CacheLockError, match=r"c\.json"), locked(path, timeout_s=0.2):
            pass
        assert time.monotonic() - start >= 0.2
    finally:
        release.set()
        t.join()
    with locked(path, timeout_s=1.0):  # free again; the holder removed its lock file
        pass
    assert not lock_path(path).exists()
    lock_path(path).write_text("left by a process that died\n")  # a stale file blocks nothing
    with locked(path, timeout_s=1.0):
        pass


def test_update_json_merges_and_replaces_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    update_json(path, lambda old: {**(old or {}), "a": 1}, validate=_as_dict)
    update_json(path, lambda old: {**(old or {}), "b": 2}, validate=_as_dict)
    assert read_json(path, _as_dict) == {"a": 1, "b": 2}
    path.write_text("[1, 2")
    with pytest.warns(CacheWarning, match=r"c\.json: ignored, not valid JSON"):
        assert read_json(path, _as_dict) is None
    path.write_text("[1, 2]")
    with pytest.warns(CacheWarning, match="expected an object, got list"):
        assert read_json(path, _as_dict) is None
    seen: list[object] = []
    update_json(path, lambda old: seen.append(old) or {"c": 3}, validate=_as_dict)
    assert seen == [None] and read_json(path, _as_dict) == {"c": 3}
    with pytest.raises(ValueError, match="non-finite"):
        update_json(path, lambda old: {"x": float("nan")}, validate=_as_dict)
    assert read_json(path, _as_dict) == {"c": 3}  # untouched


def test_best_effort_warns_once_per_file(tmp_path: Path) -> None:
    path = _blocked_root(tmp_path) / "c.json"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            with best_effort(path, "test cache"):
                update_json(path, lambda old: {"a": 1}, validate=_as_dict)
    (message,) = _cache_warnings(record)
    assert str(path) in message and "not written" in message


# -- concurrent writers: real processes released together ----------------------------------

_WISDOM_WRITER = """
import sys
from hpcnb.winograd.wisdom import store_entry
index, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
entry = {"best": {"m": 2}, "best_s": 1e-3, "default_s": 2e-3, "trials": []}
wait_for_go()
for k in range(n):
    store_entry(f"N{index}_C{k}_H8_W8_K4_r3_p1", entry, path)
"""

_TIMING_WRITER = """
import sys, time
import hpcnb.perfmodel.dataset as ds
from hpcnb.perfmodel import GridConfig, NoisePolicy, TimingConfig, collect_dataset
from hpcnb.timing import Timing
index, root = int(sys.argv[1]), sys.argv[2]

def fake(*args):
    time.sleep(0.02)
    return Timing.of([1.00, 1.01, 0.99, 1.00, 1.02])

ds.time_inference = ds.time_training = fake
grid = GridConfig(families=("resnet",), widths=(0.25 * (index + 1),), resolutions=(8,),
                  batches=(2, 3, 4), timing=TimingConfig(warmup=0, repeats=5))
wait_for_go()
rows = collect_dataset(grid, cache_dir=root, policy=NoisePolicy(max_load_per_core=1e6))
assert len(rows) == 3
"""

_DRAFT_WRITER = """
import sys
from hpcnb.speculative.distill import TrainedDraft, save_draft
from hpcnb.speculative.model import LlamaModel, tiny_config
index, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = LlamaModel.random(tiny_config(n_layers=1, vocab_size=48), seed=index)
draft = TrainedDraft(model, list(range(48)), {"writer": index})
wait_for_go()
for _ in range(n):
    save_draft(path, draft)
"""

_PRELUDE = """
import os, pathlib, sys, time
_go = pathlib.Path(os.environ["TEST_GO_FILE"])

def wait_for_go():
    pathlib.Path(f"{_go}.ready-{sys.argv[1]}").touch()
    deadline = time.monotonic() + 300
    while not _go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("never released")
        time.sleep(0.002)
"""


def _run_together(script: str, args: list[list[str]], tmp_path: Path) -> list[str]:
    """Run one process per argument list, release them at once; return their stderr."""
    code = tmp_path / "writer.py"
    code.write_text(_PRELUDE + script)
    go = tmp_path / "go"
    env = {
        **os.environ,
        "TEST_GO_FILE": str(go),
        "HPCNB_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(code), *a],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    try:
        deadline = time.monotonic() + 300
        ready = [Path(f"{go}.ready-{a[0]}") for a in args]
        while not all(r.exists() for r in ready):
            failed = [p for p in procs if p.poll() is not None]
            assert not failed, failed[0].communicate()[1][-3000:]
            assert time.monotonic() < deadline, "writers did not start"
            time.sleep(0.01)
        go.touch()
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [err for _out, err in outputs]


def test_two_processes_storing_wisdom_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "wisdom.json"
    errs = _run_together(
        _WISDOM_WRITER, [["0", "100", str(path)], ["1", "100", str(path)]], tmp_path
    )
    assert not any("Warning" in e for e in errs), errs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = read_wisdom(path)
    (shapes,) = data["machines"].values()
    assert len(shapes) == 200
    assert {f"N{i}_C{k}_H8_W8_K4_r3_p1" for i in (0, 1) for k in range(100)} == set(shapes)
    assert sorted(p.name for p in tmp_path.iterdir() if "wisdom" in p.name) == ["wisdom.json"]


@pytest.mark.slow
def test_two_processes_filling_the_timing_cache_keep_every_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    errs = _run_together(_TIMING_WRITER, [["0", str(root)], ["1", str(root)]], tmp_path)
    assert not any("CacheWarning" in e for e in errs), errs
    path = dataset_module.cache_file(root)
    data = json.loads(path.read_text())
    assert len(data["timings"]) == 6 and len(data["features"]) == 2
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    def measured(*args: object) -> Timing:
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(dataset_module, "time_inference", measured)
    for index in (0, 1):
        grid = GridConfig(
            families=("resnet",),
            widths=(0.25 * (index + 1),),
            resolutions=(8,),
            batches=(2, 3, 4),
            timing=TimingConfig(warmup=0, repeats=5),
        )
        rows = collect_dataset(grid, cache_dir=root, policy=QUIET, remeasure="none")
        assert [r.inference_timing.samples for r in rows] == [tuple(CLEAN)] * 3


def test_two_processes_saving_one_draft_never_collide(tmp_path: Path) -> None:
    path = tmp_path / "drafts" / "d.safetensors"
    path.parent.mkdir()
    errs = _run_together(_DRAFT_WRITER, [["0", "20", str(path)], ["1", "20", str(path)]], tmp_path)
    assert not any("Error" in e for e in errs), errs
    draft = load_draft(path)
    assert draft.meta["writer"] in (0, 1) and len(draft.vocab) == 48
    assert [p.name for p in path.parent.iterdir()] == ["d.safetensors"]


# -- damaged files are named, dropped and measured again -----------------------------------


class _Timer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: object) -> Timing:
        self.calls += 1
        return Timing.of(CLEAN)


def _grid(batches: tuple[int, ...] = (2, 4)) -> GridConfig:
    return GridConfig(
        families=("resnet",),
        widths=(0.25,),
        resolutions=(8,),
        batches=batches,
        timing=TimingConfig(warmup=0, repeats=5),
    )


@pytest.fixture
def fake_timers(monkeypatch: pytest.MonkeyPatch) -> tuple[_Timer, _Timer]:
    inference, training = _Timer(), _Timer()
    monkeypatch.setattr(dataset_module, "time_inference", inference)
    monkeypatch.setattr(dataset_module, "time_training", training)
    return inference, training


def test_wrong_typed_timing_entries_are_dropped_and_measured_again(
    tmp_path: Path, fake_timers: tuple[_Timer, _Timer]
) -> None:
    inference, _ = fake_timers
    first = collect_dataset(_grid(), cache_dir=tmp_path, policy=QUIET)
    assert inference.calls == 2
    path = dataset_module.cache_file(tmp_path)
    data = json.loads(path.read_text())
    bad, good = sorted(data["timings"])  # batch 2, batch 4
    data["timings"][bad]["inference"]["samples"] = "fast"
    (fkey,) = data["features"]
    path.write_text(json.dumps(data))
    with pytest.warns(CacheWarning) as record:
        again = collect_dataset(_grid(), cache_dir=tmp_path, policy=QUIET, remeasure="none")
    (message,) = _cache_warnings(record)
    assert str(path) in message and "1 entries dropped" in message and "samples" in message
    assert inference.calls == 3  # only the damaged entry was measured again
    assert [r.inference_s for r in again] == [r.inference_s for r in first]
    data["features"][fkey]["params"] = "many"
    data["timings"][good]["training"] = {"samples": [1.0], "dispersion": 0.0, "load": [0.1]}
    path.write_text(json.dumps(data))
    with pytest.warns(CacheWarning, match="3 entries dropped"):
        collect_dataset(_grid(), cache_dir=tmp_path, policy=QUIET, remeasure="none")
    assert inference.calls == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # healed: the file validates again
        collect_dataset(_grid(), cache_dir=tmp_path, policy=QUIET, remeasure="none")
    assert inference.calls == 5


@pytest.mark.parametrize(
    "content",
    [
        '{"version": 3, "features": [], "timings": {}}',
        '["not", "a", "cache"]',
        '{"version": 3, "features": {}, "timings": {"k": 7}}',
    ],
)
def test_a_timing_cache_of_the_wrong_shape_is_measured_afresh(
    tmp_path: Path, fake_timers: tuple[_Timer, _Timer], content: str
) -> None:
    inference, _ = fake_timers
    path = dataset_module.cache_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(CacheWarning, match=str(path).replace(".", r"\.")):
        rows = collect_dataset(_grid(), cache_dir=tmp_path, policy=QUIET)
    assert len(rows) == 2 and inference.calls == 2
    assert len(json.loads(path.read_text())["timings"]) == 2


@pytest.fixture(scope="module")
def latency_task():
    import numpy as np

    from hpcnb import models
    from hpcnb.pruning import ModelPruningTask

    torch.manual_seed(0)
    model = models.resnet_cifar(depth=8, width=4, in_channels=1).eval()
    x_val = np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32)
    return ModelPruningTask(model, torch.zeros(2, 1, 8, 8), x_val, np.arange(8) % 10)


def _measure_table(task: object):
    from hpcnb.pruning.latency import LayerLatencyTable

    return LayerLatencyTable.measure(task, (1, 8, 8), batch=1, threads=1, repeats=2)


@pytest.mark.parametrize(
    "damage",
    ["truncate", "negative", "nan", "missing_layer", "wrong_type"],
)
def test_a_damaged_latency_table_is_named_and_measured_again(
    latency_task: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    first = _measure_table(latency_task)
    (path,) = (tmp_path / "pruning_latency").glob("table_*.json")
    text = path.read_text()
    data = json.loads(text)
    gkey = next(iter(data["geometries"]))
    if damage == "truncate":
        text = text[: len(text) // 2]
    elif damage in ("negative", "nan"):
        data["geometries"][gkey]["samples"][0][0] = -12345.5
        text = json.dumps(data).replace("-12345.5", "NaN" if damage == "nan" else "-1.0")
    elif damage == "missing_layer":
        del data["geometries"][gkey]
        text = json.dumps(data)
    else:
        data["full"] = {"seconds": 1}
        text = json.dumps(data)
    path.write_text(text)
    with pytest.warns(CacheWarning) as record:
        table = _measure_table(latency_task)
    (message,) = _cache_warnings(record)
    assert str(path) in message and "ignored" in message
    assert not table.cached and len(table.layers) == len(first.layers)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        again = _measure_table(latency_task)  # the file was replaced by a valid table
    assert again.cached
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.fixture(scope="module")
def draft_target() -> LlamaModel:
    return LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)


SMALL = DistillSettings(
    n_layers=1, dim=32, ffn_dim=64, n_heads=2, n_kv_heads=1, n_new=4, steps=2, batch=4, vocab=48
)
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]


def test_a_damaged_draft_is_named_and_trained_again(
    draft_target: LlamaModel, tmp_path: Path
) -> None:
    path = tmp_path / "draft.safetensors"
    first = load_or_distill(draft_target, "h", PROMPTS, SMALL, path=path)
    assert first.meta["cached"] is False and load_draft(path).meta["key"] == first.meta["key"]
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.warns(CacheWarning) as record:
        again = load_or_distill(draft_target, "h", PROMPTS, SMALL, path=path)
    (message,) = _cache_warnings(record)
    assert str(path) in message and "trained again" in message
    assert again.meta["cached"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert load_or_distill(draft_target, "h", PROMPTS, SMALL, path=path).meta["cached"]


def test_a_draft_whose_meta_is_damaged_is_a_distill_error(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from hpcnb.speculative.distill import DistillError

    path = tmp_path / "d.safetensors"
    model = LlamaModel.random(tiny_config(n_layers=1, vocab_size=48), seed=0)
    save_draft(path, TrainedDraft(model, list(range(48)), {}))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        header = dict(fh.metadata())
    save_file(load_file(str(path)), str(path), metadata={**header, "meta": "{not json"})
    with pytest.raises(DistillError, match=r"d\.safetensors: damaged"):
        load_draft(path)


# -- a cache that cannot be written: one warning, the result all the same -------------------


def _use_every_cache(root: Path, task: object, target: LlamaModel) -> None:
    store_entry("N1_C3_H8_W8_K4_r3_p1", ENTRY, root / "wisdom.json")
    store_entry("N1_C4_H8_W8_K4_r3_p1", ENTRY, root / "wisdom.json")
    rows = collect_dataset(_grid((2, 4)), cache_dir=root, policy=QUIET)
    assert len(rows) == 2
    assert _measure_table(task).latency(task.group_sizes) > 0  # type: ignore[attr-defined]
    draft = load_or_distill(target, "h", PROMPTS, SMALL, path=root / "drafts" / "d.safetensors")
    assert draft.meta["cached"] is False and len(draft.vocab) > 0


def _check_one_warning_per_cache(record: list[warnings.WarningMessage], root: Path) -> None:
    messages = _cache_warnings(record)
    assert len(messages) == 4, messages
    for name in ("wisdom file", "perfmodel timing cache", "pruning latency table", "draft"):
        (found,) = [m for m in messages if m.startswith(name)]
        assert str(root) in found and "not written" in found
    assert any(issubclass(r.category, WisdomWarning) for r in record)


def test_unwritable_cache_root_degrades_to_no_caching(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_timers: tuple[_Timer, _Timer],
    latency_task: object,
    draft_target: LlamaModel,
) -> None:
    root = _blocked_root(tmp_path)
    monkeypatch.setenv("HPCNB_CACHE", str(root))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _use_every_cache(root, latency_task, draft_target)
    _check_one_warning_per_cache(record, root)
    assert read_wisdom(root / "wisdom.json") == {"format": 1, "machines": {}}


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: chmod 0o500 does not stop root from writing (the test above "
    "covers an unwritable root through a regular file instead)",
)
def test_read_only_cache_folder_degrades_to_no_caching(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_timers: tuple[_Timer, _Timer],
    latency_task: object,
    draft_target: LlamaModel,
) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    monkeypatch.setenv("HPCNB_CACHE", str(root))
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            _use_every_cache(root, latency_task, draft_target)
    finally:
        root.chmod(0o700)
    _check_one_warning_per_cache(record, root)
    assert list(root.iterdir()) == []
