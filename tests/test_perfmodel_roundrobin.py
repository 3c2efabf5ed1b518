"""The round-robin timing protocol on a simulated machine (no real time is measured)."""

from __future__ import annotations

import pytest

from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.perfmodel.roundrobin import RoundRobinPolicy, measure_round_robin


class Machine:
    """A simulated clock: kernels advance it by their cost times the round's slowdown."""

    def __init__(self, slowdowns: list[float]) -> None:
        self.now = 0.0
        self.factor = 1.0
        self.slowdowns = iter(slowdowns)
        self.pauses: list[float] = []
        self.calls: list[str] = []

    def kernel(self, name: str, cost: float):
        def run() -> None:
            self.calls.append(name)
            self.now += cost * self.factor

        return run

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.factor = next(self.slowdowns, 1.0)

    def measure(self, policy: RoundRobinPolicy, **costs: float):
        kernels = {name: self.kernel(name, cost) for name, cost in costs.items()}
        return measure_round_robin(
            kernels,
            self.kernel("reference", 0.001),
            policy,
            clock=lambda: self.now,
            load=lambda: (0.5, 0.4, 0.3),
            pause=self.pause,
        )


def test_keeps_the_minimum_of_round_medians_and_reruns_a_slow_round() -> None:
    machine = Machine([1.5, 1.0, 1.1])  # round 2 slow (reference 1.5x), round 4 slightly slow
    policy = RoundRobinPolicy(rounds=3, samples=3, pause_seconds=0.2)
    result = machine.measure(policy, conv=0.004, fc=0.0005)
    assert [r.slow for r in result.rounds] == [False, True, False, False]
    assert result.reruns == 1 and len(result.kept) == 3
    assert result.seconds["conv"] == pytest.approx(0.004)  # the fastest kept round
    assert result.round_medians("conv") == pytest.approx([0.004, 0.004, 0.0044])
    assert all(r.load == (0.5, 0.4, 0.3) for r in result.rounds)
    assert machine.pauses == [0.2, 0.2, 0.2]  # rounds spread in time


def test_repeat_counts_grow_until_a_sample_lasts_long_enough() -> None:
    machine = Machine([])
    policy = RoundRobinPolicy(min_sample_seconds=0.05, max_repeats=1024)
    result = machine.measure(policy, tiny=0.0001, big=0.2)
    assert result.repeats["tiny"] == 512  # 512 x 0.1 ms >= 50 ms, 256 x 0.1 ms is not
    assert result.repeats["big"] == 1 and result.repeats["reference"] == 64
    capped = Machine([]).measure(RoundRobinPolicy(max_repeats=8), tiny=0.0001)
    assert capped.repeats["tiny"] == 8


def test_order_rotates_between_rounds() -> None:
    machine = Machine([])
    policy = RoundRobinPolicy(rounds=3, samples=1, min_sample_seconds=1e-9)
    machine.measure(policy, a=0.001, b=0.001, c=0.001)
    timed = [n for n in machine.calls if n != "reference"][3:]  # after calibrating each once
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_an_earlier_round_is_judged_slow_once_a_faster_one_is_seen() -> None:
    machine = Machine([0.7, 0.7, 0.7])  # the first round was the disturbed one
    machine.factor = 1.0
    result = machine.measure(RoundRobinPolicy(rounds=3), conv=0.002)
    assert result.rounds[0].slow and not any(r.slow for r in result.rounds[1:])
    assert result.seconds["conv"] == pytest.approx(0.0014)


def test_reruns_are_bounded_and_bad_settings_are_refused() -> None:
    machine = Machine([2.0] * 10 + [1.0] * 10)
    result = machine.measure(RoundRobinPolicy(rounds=3, max_reruns=2), conv=0.002)
    assert result.reruns == 2 and len(result.rounds) == 5  # then slow rounds are kept
    with pytest.raises(PerfmodelError, match="rounds"):
        RoundRobinPolicy(rounds=2)
    with pytest.raises(PerfmodelError, match="reference_slack"):
        RoundRobinPolicy(reference_slack=0.9)
    with pytest.raises(PerfmodelError, match="reference"):
        measure_round_robin({"reference": lambda: None}, lambda: None)
    with pytest.raises(PerfmodelError, match="no kernel"):
        result.round_medians("fc")
