"""Tests of the shared timing layer hpcnb.timing."""

import numba
import pytest
import torch

from hpcnb import HpcnbError
from hpcnb.timing import Fresh, Timing, TimingError, interleaved, pinned_threads, ratios


def test_interleaved_order_and_samples():
    order: list[str] = []
    t = interleaved(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=2
    )
    assert order == ["a", "b"] * 5  # warm-up rounds, then timed rounds, alternating
    assert set(t) == {"a", "b"} and all(x.repeats == 3 for x in t.values())
    seq = interleaved([lambda: None, lambda: None], repeats=2, warmup=0)
    assert isinstance(seq, list) and len(seq) == 2


def test_interleaved_calls_and_lead_per_sample():
    order: list[str] = []
    t = interleaved(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        repeats=2,
        warmup=0,
        calls=3,
        lead=1,
    )
    assert order == ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4  # 1 untimed + 3 timed each
    assert all(x.repeats == 2 for x in t.values())
    with pytest.raises(TimingError, match="calls >= 1"):
        interleaved([lambda: None], calls=0)
    with pytest.raises(TimingError, match="lead >= 0"):
        interleaved([lambda: None], lead=-1)


def test_interleaved_rejects_bad_arguments():
    with pytest.raises(TimingError, match="at least one"):
        interleaved({}, repeats=1)
    with pytest.raises(TimingError, match="clock"):
        interleaved([lambda: None], clock="sundial")  # type: ignore[arg-type]
    assert issubclass(TimingError, HpcnbError)


def test_pinned_threads_restores_every_pool():
    before = (torch.get_num_threads(), numba.get_num_threads())
    with pinned_threads(1):
        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    with pytest.raises(RuntimeError), pinned_threads(1):
        raise RuntimeError("body fails")
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(TimingError, match="thread count"), pinned_threads(bad):  # type: ignore[arg-type]
            pass


def test_ratios_and_timing_of():
    t = Timing.of([3.0, 1.0, 2.0])
    assert t.median == 2.0 and t.minimum == 1.0 and t.maximum == 3.0 and t.repeats == 3
    assert ratios(Timing.of([2.0, 4.0]), Timing.of([1.0, 2.0])) == (2.0, 2.0)
    with pytest.raises(TimingError, match="differ in length"):
        ratios(Timing.of([1.0]), Timing.of([1.0, 1.0]))
    with pytest.raises(TimingError):
        Timing.of([])


def test_fresh_inputs_are_made_untimed_before_each_call():
    import time

    made: list[int] = []
    t = interleaved(
        {"fresh": Fresh(make=lambda: (time.sleep(0.02), made.append(1))[1], run=lambda _: None)},
        repeats=3,
        warmup=1,
    )
    assert len(made) == 4  # one per warm-up and timed call
    assert t["fresh"].maximum < 0.02  # the sleep in make() is not timed
    thread = interleaved([lambda: None], repeats=2, clock="thread")
    assert thread[0].repeats == 2
