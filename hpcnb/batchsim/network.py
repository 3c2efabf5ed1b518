"""Max-min fair sharing of links among flows: the flow-level network model of the engine.

A *flow* moves ``work`` units (bytes, or one whole parallel task) at a rate ``x`` that
the model chooses; on every resource ``j`` it uses (a link, the PFS read or write
link) it consumes ``count · usage[j] · x`` of the resource's capacity, where ``count``
is the number of identical flows it stands for (the ranks of a job that each write
their share). A flow may also have a ``bound`` on ``x`` (a private resource such as
the node's own network link, which limits it without being shared).

The rates are **max-min fair** (progressive filling, as in SimGrid's flow models): all
rates rise together from 0; when a resource is saturated, the flows through it are
frozen at the current level; a flow reaching its bound is frozen at its bound; the
rest keep rising. With ``usage = 1`` per byte a flow's rate is bytes per second (the
classic flow model); with ``work = 1`` and ``usage = bytes`` it is the progress rate of
a parallel task (SimGrid's ``ptask_L07``: all parts of a task progress together, and
tasks sharing a link progress at equal rates).

Example:
    Three flows, two links: A on link 1 (capacity 10), B on both, C on link 2 (4).
    Link 2 saturates first at rate 2 (B and C); A then takes the rest of link 1:

    >>> rates = max_min_rates(
    ...     [({"l1": 1.0}, 1, math.inf), ({"l1": 1.0, "l2": 1.0}, 1, math.inf),
    ...      ({"l2": 1.0}, 1, math.inf)], {"l1": 10.0, "l2": 4.0})
    >>> [round(r, 9) for r in rates]
    [8.0, 2.0, 2.0]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

from hpcnb.errors import InvalidInputError, UnknownNameError

__all__ = ["FlowNetwork", "max_min_rates"]

FlowSpec = tuple[Mapping[Hashable, float], int, float]
"""``(usage per resource, count, bound)`` of one flow for :func:`max_min_rates`."""


def max_min_rates(flows: Sequence[FlowSpec], capacity: Mapping[Hashable, float]) -> list[float]:
    """Return the max-min fair rate of each flow (progressive filling).

    Args:
        flows: ``(usage, count, bound)`` per flow: capacity used per unit of rate on each
            resource (by one of its ``count`` identical flows), and the largest rate.
        capacity: Capacity of each resource named in a usage.

    Returns:
        The rate of each flow; ``inf`` for a flow that uses nothing and has no bound.

    Raises:
        KeyError: A flow uses a resource without a capacity.
    """
    resources = {j for usage, _, _ in flows for j, u in usage.items() if u > 0}
    if len(resources) == 1:
        return _one_resource(flows, float(capacity[next(iter(resources))]))
    rates = [0.0] * len(flows)
    active = set()
    for i, (usage, count, bound) in enumerate(flows):
        if bound <= 0 or count <= 0:
            continue
        if not any(u > 0 for u in usage.values()) and math.isinf(bound):
            rates[i] = math.inf
            continue
        active.add(i)
    remaining = {j: float(capacity[j]) for i in active for j in flows[i][0]}
    level = 0.0
    while active:
        load: dict[Hashable, float] = {}
        for i in active:
            usage, count, _ = flows[i]
            for j, u in usage.items():
                if u > 0:
                    load[j] = load.get(j, 0.0) + count * u
        step = math.inf
        first: tuple[Literal["resource"], Hashable] | tuple[Literal["flow"], int] | None = None
        for j, total in load.items():
            if max(0.0, remaining[j]) / total < step:
                step, first = max(0.0, remaining[j]) / total, ("resource", j)
        for i in active:
            if flows[i][2] - level < step:
                step, first = flows[i][2] - level, ("flow", i)
        level += step
        for j, total in load.items():
            remaining[j] -= step * total
        saturated = {j for j in load if remaining[j] <= 1e-12 * capacity[j]}
        if first is not None and first[0] == "resource":
            saturated.add(first[1])
        frozen = {
            i
            for i in active
            if flows[i][2] - level <= 1e-12 * max(1.0, abs(level))
            or any(j in saturated for j, u in flows[i][0].items() if u > 0)
        }
        if first is not None and first[0] == "flow":
            frozen.add(first[1])
        for i in frozen:
            rates[i] = level
        active -= frozen
    return rates


def _one_resource(flows: Sequence[FlowSpec], capacity: float) -> list[float]:
    """Water-filling on one shared resource: :func:`max_min_rates` in ``O(n log n)``."""
    rates = [0.0] * len(flows)
    load = 0.0
    order = []
    for i, (usage, count, bound) in enumerate(flows):
        u = sum(usage.values())
        if bound <= 0 or count <= 0:
            continue
        if u <= 0:
            rates[i] = bound
            continue
        load += count * u
        order.append((bound, i, count * u))
    order.sort()
    for k, (bound, i, weight) in enumerate(order):
        if load <= 0:  # the running difference cancelled (one flow's weight dwarfed the rest)
            load = math.fsum(w for _, _, w in order[k:])
        level = max(0.0, capacity) / load
        if bound > level:  # this flow and all with larger bounds share the level
            for _, j, _ in order[k:]:
                rates[j] = level
            break
        rates[i] = bound
        capacity -= weight * bound
        load -= weight
    return rates


class _Flow:
    __slots__ = ("bound", "count", "rate", "remaining", "usage", "work")

    def __init__(self, work: float, usage: dict[Hashable, float], bound: float, count: int) -> None:
        self.work = work
        self.remaining = work
        self.usage = usage
        self.bound = bound
        self.count = count
        self.rate = 0.0


class FlowNetwork:
    """The flows active now on a set of shared resources, with their fair rates.

    Rates are recomputed whenever a flow joins or leaves; between two changes every flow
    progresses linearly. ``token`` changes with every recomputation, so an event
    scheduled for the next completion can tell whether it is stale.

    Args:
        capacity: Capacity of each shared resource (units per second).
    """

    def __init__(self, capacity: Mapping[Hashable, float]) -> None:
        for name, value in capacity.items():
            if not value > 0:
                raise InvalidInputError(f"resource {name!r}: capacity {value} must be > 0")
        self.capacity = dict(capacity)
        self.flows: dict[Hashable, _Flow] = {}
        self._users: dict[Hashable, dict[Hashable, None]] = {}  # resource -> flow keys
        self._multi = 0  # active flows that use more than one resource
        self.last = 0.0
        self.token = 0

    def add_resource(self, name: Hashable, capacity: float) -> None:
        """Declare a shared resource (a no-op if it exists).

        Args:
            name: Key of the resource (a link, the PFS read or write side).
            capacity: Its capacity (units per second, > 0).

        Raises:
            InvalidInputError: A new resource with a capacity that is not positive.
        """
        if name not in self.capacity:
            if not capacity > 0:
                raise InvalidInputError(f"resource {name!r}: capacity {capacity} must be > 0")
            self.capacity[name] = float(capacity)

    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            for flow in self.flows.values():
                if flow.rate > 0:
                    flow.remaining -= flow.rate * dt
        self.last = max(self.last, now)

    def _solve(self, touched: set[Hashable]) -> None:
        """Recompute the rates of the flows connected (through resources) to ``touched``."""
        self.token += 1
        if not self._multi:  # every flow on one resource: each resource on its own
            for resource in touched:
                flows = [self.flows[k] for k in self._users.get(resource, ())]
                if len(flows) == 1:  # alone: its bound, or the whole resource
                    f = flows[0]
                    u = f.count * f.usage[resource]
                    f.rate = min(f.bound, self.capacity[resource] / u) if u > 0 else f.bound
                    continue
                specs = [(f.usage, f.count, f.bound) for f in flows]
                rates = _one_resource(specs, self.capacity[resource])
                for flow, rate in zip(flows, rates, strict=True):
                    flow.rate = rate
            return
        keys: dict[Hashable, None] = {}
        seen: set[Hashable] = set()
        todo = list(touched)
        while todo:
            resource = todo.pop()
            if resource in seen:
                continue
            seen.add(resource)
            for key in self._users.get(resource, ()):
                if key not in keys:
                    keys[key] = None
                    todo.extend(self.flows[key].usage)
        flows = [self.flows[k] for k in keys]
        specs = [(f.usage, f.count, f.bound) for f in flows]
        for flow, rate in zip(flows, max_min_rates(specs, self.capacity), strict=True):
            flow.rate = rate

    def add(
        self,
        key: Hashable,
        work: float,
        usage: Mapping[Hashable, float],
        now: float,
        *,
        bound: float = math.inf,
        count: int = 1,
    ) -> None:
        """Start a flow of ``work`` units at ``now`` (see the module docstring).

        Args:
            key: Key of the flow, unique among the active ones.
            work: Units to move (bytes, or seconds of a parallel task).
            usage: Capacity used per unit of rate on each resource it crosses.
            now: Current time (s); the other flows progress up to it first.
            bound: Largest rate of the flow.
            count: Identical flows it stands for (each with this usage and bound).

        Raises:
            InvalidInputError: A flow with this key is already active.
            UnknownNameError: The usage names a resource without a capacity.
        """
        if key in self.flows:
            raise InvalidInputError(f"flow {key!r} is already active")
        for name in usage:
            if name not in self.capacity:
                raise UnknownNameError(f"flow {key!r}: unknown resource {name!r}")
        self._advance(now)
        flow = self.flows[key] = _Flow(float(work), dict(usage), float(bound), int(count))
        for name in flow.usage:
            self._users.setdefault(name, {})[key] = None
        self._multi += len(flow.usage) > 1
        if flow.usage:
            self._solve(set(flow.usage))
        else:
            flow.rate = max_min_rates([(flow.usage, flow.count, flow.bound)], self.capacity)[0]
            self.token += 1

    def _drop(self, key: Hashable) -> set[Hashable]:
        flow = self.flows.pop(key)
        self._multi -= len(flow.usage) > 1
        for name in flow.usage:
            del self._users[name][key]
        return set(flow.usage)

    def remove(self, key: Hashable, now: float) -> None:
        """Abort a flow (a killed job); a no-op if it is not active.

        Args:
            key: Key of the flow.
            now: Current time (s); the flows progress up to it first.
        """
        self._advance(now)
        if key in self.flows:
            self._solve(self._drop(key))

    def rate(self, key: Hashable) -> float:
        """Return the current rate of a flow."""
        return self.flows[key].rate

    def next_completion(self, now: float) -> float | None:
        """Return when the next flow completes at the current rates, or ``None``."""
        self._advance(now)
        best = math.inf
        for flow in self.flows.values():
            if flow.rate > 0:
                best = min(best, max(0.0, flow.remaining) / flow.rate)
        return None if math.isinf(best) else now + best

    def pop_finished(self, now: float) -> list[Hashable]:
        """Return (and remove) the flows complete at ``now``, in joining order."""
        self._advance(now)
        done = []
        for key, flow in self.flows.items():
            # bytes left that one floating-point step of the clock could not move
            tol = max(1e-9 * flow.work, 2.0 * math.ulp(max(now, 1.0)) * flow.rate)
            if flow.remaining <= tol or math.isinf(flow.rate):
                done.append(key)
        touched: set[Hashable] = set()
        for key in done:
            touched |= self._drop(key)
        if done:
            self._solve(touched)
        return done
