"""Tests of the Winograd wisdom file: validation, limits, warnings and atomic writes.

A wisdom file that does not validate is ignored with a WisdomWarning naming the file and
the problem, never an exception; the next autotune() replaces it; writes are atomic.
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import asdict

import numpy as np
import pytest

from hpcnb.paths import machine_key
from hpcnb.winograd.autotune import autotune
from hpcnb.winograd.config import WinogradConfig
from hpcnb.winograd.conv import conv2d_winograd
from hpcnb.winograd.wisdom import (
    MAX_WISDOM_BYTES,
    WisdomWarning,
    lookup_wisdom,
    read_wisdom,
    shape_key,
    write_wisdom,
)

XS, WS = (1, 2, 8, 8), (2, 2, 3, 3)
KEY = shape_key(XS, WS, 1)
GOOD_CFG = asdict(WinogradConfig(m=2))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))
    monkeypatch.delenv("HPCNB_WISDOM", raising=False)


def _entry(**over: object) -> dict:
    entry = {
        "best": dict(GOOD_CFG),
        "best_s": 0.001,
        "default_s": 0.002,
        "trials": [{"config": dict(GOOD_CFG), "seconds": 0.001}],
        "final": [{"config": dict(GOOD_CFG), "seconds": 0.001}],
        "measured_at": "2026-01-01T00:00:00Z",
    }
    entry.update(over)
    return entry


def _wisdom(entry: dict | None = None) -> dict:
    return {"format": 1, "machines": {machine_key(): {KEY: entry or _entry()}}}


def _with_config(**over: object) -> dict:
    return _wisdom(_entry(best={**GOOD_CFG, **over}))


def test_valid_wisdom_round_trip(tmp_path):
    path = tmp_path / "w.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_wisdom(path) == {"format": 1, "machines": {}}  # missing: empty, silent
        assert write_wisdom(_wisdom(), path) == path
        assert read_wisdom(path) == _wisdom()
        assert lookup_wisdom(XS, WS, 1, path=path) == WinogradConfig(m=2)
        # optional fields may be absent
        entry = _entry()
        del entry["final"], entry["measured_at"]
        write_wisdom(_wisdom(entry), path)
        assert lookup_wisdom(XS, WS, 1, path=path) == WinogradConfig(m=2)
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]  # no temporary file left


MACHINE = machine_key()
MALFORMED_JSON = {
    "unknown top-level field": (
        json.dumps({**_wisdom(), "extra": 1}),
        "top level: unknown field 'extra'",
    ),
    "unknown entry field": (json.dumps(_wisdom(_entry(comment="hi"))), "unknown field 'comment'"),
    "unknown config field": (json.dumps(_with_config(tile=3)), "unknown field 'tile'"),
    "machines as a list": (
        json.dumps({"format": 1, "machines": [_entry()]}),
        "'machines': expected an object, got list",
    ),
    "shapes as a list": (
        json.dumps({"format": 1, "machines": {MACHINE: [1, 2]}}),
        "expected an object, got list",
    ),
    "entry as a string": (
        json.dumps({"format": 1, "machines": {MACHINE: {KEY: "fast"}}}),
        "expected an object, got str",
    ),
    "top level a list": ("[]", "top level: expected an object, got list"),
    "missing machines": ('{"format": 1}', "missing field 'machines'"),
    "missing best": (
        json.dumps(_wisdom({k: v for k, v in _entry().items() if k != "best"})),
        "missing field 'best'",
    ),
    "other format": (json.dumps({**_wisdom(), "format": 2}), "reads format 1"),
    "format true": (json.dumps({**_wisdom(), "format": True}), "reads format 1"),
    "m as a string": (json.dumps(_with_config(m="4")), "expected int, got str"),
    "m as a bool": (json.dumps(_with_config(m=True)), "expected int, got bool"),
    "m as a float": (json.dumps(_with_config(m=4.0)), "expected int, got float"),
    "channel_major as int": (json.dumps(_with_config(channel_major=1)), "expected bool, got int"),
    "bad m": (json.dumps(_with_config(m=0)), "best"),
    "m too large for r": (json.dumps(_with_config(m=19)), "F(19, 3)"),
    "not a shape key": (
        json.dumps({"format": 1, "machines": {MACHINE: {"conv1": _entry()}}}),
        "not a shape key",
    ),
    "bad gemm": (json.dumps(_with_config(gemm="cuda")), "gemm must be one of"),
    "bad points": (json.dumps(_with_config(points="weird")), "points"),
    "negative threads": (json.dumps(_with_config(threads=-1)), "threads must be"),
    "best_s as a string": (json.dumps(_wisdom(_entry(best_s="0.1"))), "number of seconds, got str"),
    "best_s zero": (json.dumps(_wisdom(_entry(best_s=0))), "finite number of seconds > 0"),
    "best_s negative": (json.dumps(_wisdom(_entry(best_s=-1.0))), "> 0"),
    "best_s null": (json.dumps(_wisdom(_entry(best_s=None))), "got NoneType"),
    "trials not a list": (json.dumps(_wisdom(_entry(trials={"a": 1}))), "expected a list"),
    "trial without seconds": (
        json.dumps(_wisdom(_entry(trials=[{"config": GOOD_CFG}]))),
        "missing field 'seconds'",
    ),
    "final with a bad config": (
        json.dumps(_wisdom(_entry(final=[{"config": {"m": "x"}, "seconds": 1.0}]))),
        "['final'][0]['config']['m']: expected int",
    ),
    "measured_at a number": (json.dumps(_wisdom(_entry(measured_at=5))), "expected a string"),
    "torch_s negative": (json.dumps(_wisdom(_entry(torch_s=-1.0))), "['torch_s']: expected"),
    "torch_s a string": (json.dumps(_wisdom(_entry(torch_s="1"))), "number of seconds, got str"),
    "NaN": (json.dumps(_wisdom(_entry(best_s=float("nan")))), "non-finite number NaN"),
    "Infinity": (json.dumps(_wisdom(_entry(default_s=float("inf")))), "non-finite number Infinity"),
    "-Infinity": (
        json.dumps(_wisdom(_entry(trials=[{"config": GOOD_CFG, "seconds": float("-inf")}]))),
        "non-finite number -Infinity",
    ),
    "1e400": (json.dumps(_wisdom()).replace('"best_s": 0.001', '"best_s": 1e400'), "out of range"),
    "huge integer": (
        json.dumps(_wisdom()).replace('"best_s": 0.001', '"best_s": 1' + "0" * 400),
        "finite number of seconds",
    ),
    "integer of 5000 digits": (
        json.dumps(_wisdom()).replace('"best_s": 0.001', '"best_s": 1' + "0" * 5000),
        "not valid JSON",
    ),
    "duplicate key": ('{"format": 1, "format": 1, "machines": {}}', "duplicate key 'format'"),
    "truncated": (json.dumps(_wisdom())[:-7], "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "deeply nested": (
        '{"format": 1, "machines": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_JSON))
def test_malformed_wisdom_is_ignored_with_a_warning(tmp_path, case):
    text, reason = MALFORMED_JSON[case]
    path = tmp_path / "wisdom.json"
    path.write_text(text)
    with pytest.warns(WisdomWarning) as rec:
        assert lookup_wisdom(XS, WS, 1, path=path) is None
    (w,) = [r for r in rec if issubclass(r.category, WisdomWarning)]
    message = str(w.message)
    assert str(path) in message and "ignored" in message
    assert reason in message, message
    with pytest.warns(WisdomWarning):
        assert read_wisdom(path) == {"format": 1, "machines": {}}


def test_non_utf8_and_directory_are_ignored(tmp_path):
    path = tmp_path / "w.json"
    path.write_bytes(b'{"format": 1, "machines": {"\xff\xfe": {}}}')
    with pytest.warns(WisdomWarning, match="not UTF-8"):
        assert lookup_wisdom(XS, WS, 1, path=path) is None
    folder = tmp_path / "adir.json"
    folder.mkdir()
    with pytest.warns(WisdomWarning, match="unreadable"):
        assert lookup_wisdom(XS, WS, 1, path=folder) is None


def test_size_limit_is_documented_and_overridable(tmp_path, monkeypatch):
    path = tmp_path / "w.json"
    write_wisdom(_wisdom(), path)
    size = path.stat().st_size
    assert MAX_WISDOM_BYTES == 16 * 2**20
    with pytest.warns(WisdomWarning, match=f"larger than the limit of {size - 1} bytes"):
        assert read_wisdom(path, max_bytes=size - 1)["machines"] == {}
    assert read_wisdom(path, max_bytes=size) == _wisdom()
    monkeypatch.setenv("HPCNB_WISDOM_MAX_BYTES", str(size - 1))  # the process default
    with pytest.warns(WisdomWarning, match="larger than the limit"):
        assert lookup_wisdom(XS, WS, 1, path=path) is None
    monkeypatch.setenv("HPCNB_WISDOM_MAX_BYTES", "lots")
    with pytest.warns(WisdomWarning, match="not a positive integer"):
        assert lookup_wisdom(XS, WS, 1, path=path) == WinogradConfig(m=2)


def test_huge_file_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    path = tmp_path / "w.json"
    with open(path, "wb") as fh:  # a sparse 20 GB file: reading it whole would fail
        fh.truncate(20 * 10**9)
    monkeypatch.setenv("HPCNB_WISDOM_MAX_BYTES", str(1 << 20))
    with pytest.warns(WisdomWarning, match="larger than the limit of 1048576 bytes"):
        assert lookup_wisdom(XS, WS, 1, path=path) is None


def test_convolution_ignores_broken_wisdom(tmp_path):
    path = tmp_path / "w.json"
    path.write_text('{"format": 1, "machines": []}')
    rng = np.random.default_rng(0)
    x = rng.standard_normal(XS, dtype=np.float32)
    w = rng.standard_normal(WS, dtype=np.float32)
    with pytest.warns(WisdomWarning, match="machines"):
        y = conv2d_winograd(x, w, padding=1, config="wisdom", wisdom=str(path))
    ref = conv2d_winograd(x, w, padding=1, m=4)
    np.testing.assert_allclose(y, ref, atol=1e-5)


def test_convolution_reads_wisdom_only_when_asked(tmp_path, monkeypatch):
    path = tmp_path / "w.json"
    monkeypatch.setenv("HPCNB_WISDOM", str(path))
    write_wisdom(_wisdom(), path)  # tuned here: m=2 for this shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal(XS, dtype=np.float32)
    w = rng.standard_normal(WS, dtype=np.float32)
    seen: list[object] = []
    monkeypatch.setattr(
        "hpcnb.winograd.backend.lookup_wisdom",
        lambda *a, **k: seen.append(a) or lookup_wisdom(*a, **k),
    )
    conv2d_winograd(x, w, padding=1)  # the default configuration, no file read
    assert seen == []
    path.write_text("{broken")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv2d_winograd(x, w, padding=1)  # a broken file is not even looked at
    with pytest.warns(WisdomWarning, match="not valid JSON"):
        conv2d_winograd(x, w, padding=1, config="wisdom")
    assert len(seen) == 1
    with pytest.raises(ValueError, match="config='wisdom'"):
        conv2d_winograd(x, w, padding=1, wisdom=str(path))
    with pytest.raises(ValueError, match="config must be"):
        conv2d_winograd(x, w, padding=1, config="fastest")


def test_wisdom_of_the_old_machine_key_format_does_not_match(tmp_path):
    path = tmp_path / "w.json"
    old_key = "Some CPU @ 2.0GHz|cpus=2|numba_threads=2"  # format of older versions
    write_wisdom({"format": 1, "machines": {old_key: {KEY: _entry()}}}, path)
    assert machine_key() != old_key and " | " in machine_key()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup_wisdom(XS, WS, 1, path=path) is None


def test_autotune_replaces_broken_wisdom(tmp_path):
    path = tmp_path / "w.json"
    path.write_text('{"format": 1, "machines": {"x": {"y": {"best": {"m": "4"}}}}}')
    space = [WinogradConfig(m=2)]
    with pytest.warns(WisdomWarning, match="ignored"):
        res = autotune(XS, WS, 1, space=space, reps=1, finalists=1, final_reps=1, path=path)
    assert not res.from_wisdom
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = read_wisdom(path)  # valid now
        assert list(data["machines"]) == [machine_key()]
        again = autotune(XS, WS, 1, space=space, path=path)
    assert again.from_wisdom and again.best == res.best


def test_autotune_that_cannot_write_warns_and_returns(tmp_path):
    path = tmp_path / "w.json"
    path.mkdir()  # neither readable nor replaceable as a file
    space = [WinogradConfig(m=2)]
    with pytest.warns(WisdomWarning) as rec:
        res = autotune(XS, WS, 1, space=space, reps=1, finalists=1, final_reps=1, path=path)
    messages = " | ".join(str(r.message) for r in rec)
    assert "unreadable" in messages and "not written" in messages
    assert res.best_s > 0 and not res.from_wisdom


def test_write_wisdom_refuses_invalid_data(tmp_path):
    path = tmp_path / "w.json"
    write_wisdom(_wisdom(), path)
    with pytest.raises(ValueError, match=r"does not validate.*unknown field 'x'"):
        write_wisdom({**_wisdom(), "x": 1}, path)
    with pytest.raises(ValueError, match="finite number of seconds"):
        write_wisdom(_wisdom(_entry(best_s=float("nan"))), path)
    assert read_wisdom(path) == _wisdom()  # untouched


def test_concurrent_reader_never_sees_half_a_wisdom_file(tmp_path):
    path = tmp_path / "w.json"
    big = {
        "format": 1,
        "machines": {
            f"machine {i}": {KEY: _entry(trials=[_entry()["trials"][0]] * 50)} for i in range(60)
        },
    }
    small = _wisdom()
    write_wisdom(small, path)
    problems: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                data = read_wisdom(path)
            problems.extend(str(r.message) for r in rec)
            if data not in (big, small):
                problems.append("unexpected content")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(30):
            write_wisdom(big if i % 2 == 0 else small, path)
    finally:
        stop.set()
        t.join()
    assert problems == []
