"""Nodes with identity: network topologies, allocation policies and per-node state.

A :class:`Topology` says how the nodes are wired, at the level of detail the flow model
needs: nodes are grouped (the nodes of one leaf switch of a fat-tree, or of one group of
a dragonfly), every node has its own link to its group (``link_bandwidth``), and each
group reaches the rest of the machine through its *uplinks* (``uplink_bandwidth`` in
all, the leaf's links to the spine, or the group's global links). Traffic between two
nodes of one group stays inside it; traffic between groups crosses both groups'
uplinks. A **crossbar** is one group with unlimited uplinks: every pair of nodes talks
through the two nodes' own links only.

A :class:`NodePool` hands out node ids under an allocation policy:

* ``first-fit``: the lowest free ids;
* ``contiguous``: the first run of consecutive free ids, else first-fit;
* ``topology``: the fewest groups: the group with the fewest free nodes that still holds
  the whole job (best fit), else whole groups by decreasing free nodes.

It keeps each node's state (``free``, ``allocated`` or ``reserved`` for a job that grows
at its next scheduling point) and logs every change as a row of ElastiSim's
``node_utilization.csv`` (``Time, Node, State, Running jobs, Expected jobs``).

Example:
    >>> topo = Topology.fat_tree(num_nodes=8, leaf_size=4, uplinks=1, link_bandwidth=1.0)
    >>> pool = NodePool(8, topo, "topology")
    >>> pool.take(3, job=1, time=0.0)
    [0, 1, 2]
    >>> pool.take(2, job=2, time=0.0)  # group 1 holds it whole; first-fit would split
    [4, 5]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hpcnb.errors import InvalidInputError

__all__ = [
    "ALLOCATION_POLICIES",
    "NODE_UTILIZATION_COLUMNS",
    "NodePool",
    "Topology",
    "group_traffic",
]

ALLOCATION_POLICIES = ("first-fit", "contiguous", "topology")
NODE_UTILIZATION_COLUMNS = ("Time", "Node", "State", "Running jobs", "Expected jobs")


@dataclass(frozen=True)
class Topology:
    """How the nodes are wired (see the module docstring).

    Attributes:
        kind: ``"crossbar"``, ``"fat-tree"`` or ``"dragonfly"``.
        group_size: Nodes per group (leaf switch or dragonfly group); 0 for a crossbar.
        uplink_bandwidth: Bytes/s from one group to the rest of the machine (all its
            uplinks together); ``inf`` for a crossbar.
    """

    kind: str = "crossbar"
    group_size: int = 0
    uplink_bandwidth: float = math.inf

    def __post_init__(self) -> None:
        if self.kind not in ("crossbar", "fat-tree", "dragonfly"):
            raise InvalidInputError(
                f"Topology.kind={self.kind!r}: expected crossbar, fat-tree or dragonfly"
            )
        if self.kind != "crossbar" and (self.group_size < 1 or not self.uplink_bandwidth > 0):
            raise InvalidInputError(
                f"{self.kind}: group_size={self.group_size} and uplink_bandwidth="
                f"{self.uplink_bandwidth} must be positive"
            )

    @classmethod
    def crossbar(cls) -> Topology:
        """Every node on its own link to one non-blocking switch."""
        return cls()

    @classmethod
    def fat_tree(
        cls, num_nodes: int, leaf_size: int, uplinks: int, link_bandwidth: float
    ) -> Topology:
        """A two-level fat-tree: leaves of ``leaf_size`` nodes with ``uplinks`` spine links.

        ``uplinks < leaf_size`` makes the tree oversubscribed (``leaf_size / uplinks``).

        Args:
            num_nodes: Nodes of the machine.
            leaf_size: Nodes per leaf switch, in ``[1, num_nodes]``.
            uplinks: Links from each leaf to the spines (>= 1).
            link_bandwidth: Bandwidth of one link (bytes/s).

        Raises:
            InvalidInputError: A leaf size or uplink count out of range.
        """
        if not 1 <= leaf_size <= num_nodes or uplinks < 1:
            raise InvalidInputError(
                f"fat_tree(leaf_size={leaf_size}, uplinks={uplinks}): expected "
                f"1 <= leaf_size <= {num_nodes} and uplinks >= 1"
            )
        return cls("fat-tree", leaf_size, uplinks * link_bandwidth)

    @classmethod
    def dragonfly(cls, group_size: int, global_links: int, link_bandwidth: float) -> Topology:
        """Dragonfly groups of ``group_size`` nodes joined by ``global_links`` links each.

        Args:
            group_size: Nodes per group (>= 1).
            global_links: Links from each group to the other groups (>= 1).
            link_bandwidth: Bandwidth of one link (bytes/s).

        Raises:
            InvalidInputError: A group size or link count below 1.
        """
        if group_size < 1 or global_links < 1:
            raise InvalidInputError(
                f"dragonfly(group_size={group_size}, global_links={global_links}): "
                "both must be >= 1"
            )
        return cls("dragonfly", group_size, global_links * link_bandwidth)

    def group(self, node: int) -> int:
        """Return the group of a node (0 on a crossbar)."""
        return node // self.group_size if self.group_size else 0

    def num_groups(self, num_nodes: int) -> int:
        """Return the number of groups of a machine of ``num_nodes`` nodes."""
        return -(-num_nodes // self.group_size) if self.group_size else 1


class NodePool:
    """Node ids of a machine, their owners and state, under an allocation policy.

    Args:
        num_nodes: Nodes of the machine (ids ``0 .. num_nodes - 1``).
        topology: The wiring (groups for the ``topology`` policy).
        policy: One of :data:`ALLOCATION_POLICIES`.
        names: Host names for the log (default ``node<i>``).
        log: Whether to keep the per-node state log.
    """

    def __init__(
        self,
        num_nodes: int,
        topology: Topology | None = None,
        policy: str = "first-fit",
        names: Sequence[str] = (),
        log: bool = True,
    ) -> None:
        if policy not in ALLOCATION_POLICIES:
            raise InvalidInputError(
                f"allocation policy {policy!r}: expected one of {ALLOCATION_POLICIES}"
            )
        self.num_nodes = num_nodes
        self.topology = topology or Topology.crossbar()
        self.policy = policy
        self.names = (
            list(names) if len(names) == num_nodes else [f"node{i}" for i in range(num_nodes)]
        )
        self.owner = [-1] * num_nodes  # job id holding the node, -1 when free
        self.reserved = [False] * num_nodes
        self._heap = list(range(num_nodes))  # free ids (first-fit), lazily cleaned
        groups = self.topology.num_groups(num_nodes)
        self._group_free: list[set[int]] = [set() for _ in range(groups)]
        for node in range(num_nodes):
            self._group_free[self.topology.group(node)].add(node)
        self.free_count = num_nodes
        self.log_rows: list[tuple[float, str, str, str, str]] | None = [] if log else None

    def _log(self, time: float, node: int) -> None:
        if self.log_rows is None:
            return
        job = self.owner[node]
        if job < 0:
            self.log_rows.append((float(time), self.names[node], "free", "", ""))
        elif self.reserved[node]:
            self.log_rows.append((float(time), self.names[node], "reserved", "", str(job)))
        else:
            self.log_rows.append((float(time), self.names[node], "allocated", str(job), ""))

    def _choose(self, n: int) -> list[int]:
        if self.policy == "contiguous":
            run = 0
            for node in range(self.num_nodes):
                run = run + 1 if self.owner[node] < 0 else 0
                if run == n:
                    return list(range(node - n + 1, node + 1))
        if self.policy == "topology":
            fits = [(len(free), g) for g, free in enumerate(self._group_free) if len(free) >= n]
            if fits:
                return sorted(self._group_free[min(fits)[1]])[:n]
            chosen: list[int] = []
            order = sorted(
                range(len(self._group_free)), key=lambda g: (-len(self._group_free[g]), g)
            )
            for g in order:
                chosen += sorted(self._group_free[g])[: n - len(chosen)]
                if len(chosen) == n:
                    return chosen
        chosen = []  # first-fit; the heap may hold taken or repeated ids: skip them
        while len(chosen) < n:
            node = heapq.heappop(self._heap)
            if self.owner[node] < 0 and (not chosen or node != chosen[-1]):
                chosen.append(node)
        return chosen

    def take(self, n: int, job: int, time: float, reserved: bool = False) -> list[int]:
        """Give ``n`` free nodes to ``job`` (reserved until it uses them, if ``reserved``).

        Args:
            n: Nodes wanted.
            job: Id of the job that takes them.
            time: Current time (s), for the state log.
            reserved: Hold the nodes for the job without running on them yet.

        Returns:
            The ids of the nodes, chosen by the allocation policy.

        Raises:
            InvalidInputError: Fewer than ``n`` nodes are free.
        """
        if n > self.free_count:
            raise InvalidInputError(f"job {job}: {n} nodes asked, {self.free_count} free")
        chosen = self._choose(n) if n > 0 else []
        for node in chosen:
            self.owner[node] = job
            self.reserved[node] = reserved
            self._group_free[self.topology.group(node)].discard(node)
            self._log(time, node)
        self.free_count -= len(chosen)
        return chosen

    def activate(self, nodes: Sequence[int], time: float) -> None:
        """Mark reserved nodes as allocated (the job grew onto them).

        Args:
            nodes: Ids of the nodes; those not reserved are left as they are.
            time: Current time (s), for the state log.
        """
        for node in nodes:
            if self.reserved[node]:
                self.reserved[node] = False
                self._log(time, node)

    def release(self, nodes: Sequence[int], time: float) -> None:
        """Free nodes.

        Args:
            nodes: Ids of the nodes, each held by a job.
            time: Current time (s), for the state log.

        Raises:
            InvalidInputError: A node is already free.
        """
        for node in nodes:
            if self.owner[node] < 0:
                raise InvalidInputError(f"node {node} is already free")
            self.owner[node] = -1
            self.reserved[node] = False
            self._group_free[self.topology.group(node)].add(node)
            heapq.heappush(self._heap, node)
            self._log(time, node)
        self.free_count += len(nodes)

    def groups_of(self, nodes: Sequence[int]) -> int:
        """Return how many groups the nodes span."""
        return len({self.topology.group(n) for n in nodes})


def group_traffic(
    pattern: str, nbytes: float, groups: Sequence[int]
) -> tuple[dict[int, float], dict[int, float]]:
    """Return the bytes each group sends out and receives for one collective.

    Ranks are the positions in ``groups`` (rank ``i`` runs on a node of group
    ``groups[i]``); the per-pair payloads are ElastiSim's (``all_to_all``: ``B / (n(n-1))``
    to every other rank; ``ring``: ``B / 2n`` to both neighbours; ``scatter`` /
    ``gather``: ``B / n`` from / to the root; ``master_worker``: ``2B / (n-1)`` both ways
    between the root and each worker) and ours for ``allreduce`` (ring all-reduce:
    ``2(n-1)/n · B`` to the next rank). Only traffic between different groups counts.

    Args:
        pattern: A communication pattern of :data:`~hpcnb.batchsim.platform.COMMUNICATION_PATTERNS`.
        nbytes: Total payload of the collective (bytes).
        groups: Group of each rank's node, in rank order.

    Returns:
        ``(bytes sent out, bytes received)`` by group; groups without traffic are absent.

    Raises:
        InvalidInputError: A pattern without a traffic model.

    Example:
        >>> group_traffic("all_to_all", 12.0, [0, 0, 1, 1])  # 4 pairs cross, 1 B each way
        ({0: 4.0, 1: 4.0}, {0: 4.0, 1: 4.0})
    """
    n = len(groups)
    out: dict[int, float] = {}
    inn: dict[int, float] = {}

    def send(src: int, dst: int, amount: float) -> None:
        a, b = groups[src], groups[dst]
        if a != b and amount > 0:
            out[a] = out.get(a, 0.0) + amount
            inn[b] = inn.get(b, 0.0) + amount

    if n <= 1 or nbytes <= 0 or pattern in ("", "none"):
        return out, inn
    if pattern == "all_to_all":
        pair = nbytes / (n * (n - 1))
        counts: dict[int, int] = {}
        for g in groups:
            counts[g] = counts.get(g, 0) + 1
        for g, k in counts.items():
            if k < n:
                out[g] = inn[g] = k * (n - k) * pair
    elif pattern == "ring":
        for i in range(n):
            send(i, (i - 1) % n, nbytes / (2 * n))
            send(i, (i + 1) % n, nbytes / (2 * n))
    elif pattern == "allreduce":
        for i in range(n):
            send(i, (i + 1) % n, 2 * (n - 1) / n * nbytes)
    elif pattern in ("scatter", "gather"):
        for i in range(1, n):
            if pattern == "scatter":
                send(0, i, nbytes / n)
            else:
                send(i, 0, nbytes / n)
    elif pattern == "master_worker":
        for i in range(1, n):
            send(0, i, nbytes / ((n - 1) / 2))
            send(i, 0, nbytes / ((n - 1) / 2))
    else:
        raise InvalidInputError(f"communication pattern {pattern!r} has no traffic model")
    return out, inn
