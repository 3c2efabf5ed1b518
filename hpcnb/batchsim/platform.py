"""The simulated machine: homogeneous nodes, a crossbar network and a shared PFS.

Times follow SimGrid's parallel-task model ``ptask_L07``, which ElastiSim runs: a task is
one activity over hosts and links; it waits for the largest latency of the routes it
uses, then progresses at one rate, so its duration is that latency plus the largest of

* ``flops / speed`` on each node,
* the bytes each link carries over its bandwidth (a crossbar node has its own link in
  each direction, SimGrid's ``SPLITDUPLEX`` cluster links; node to node crosses two
  links, ``2 · lat``; node to PFS crosses its link and the PFS link), and
* the TCP window bound ``2 · latency · bytes / tcp_gamma`` of the largest
  ``latency × bytes`` of its transfers (SimGrid's ``network/TCP-gamma``, 4 MiB by
  default): one flow moves at most ``tcp_gamma / (2 · route latency)`` bytes/s.

Collectives spread ``bytes`` (the task's total payload) over pairs of nodes as ElastiSim
does (``Utility::createMatrix``):

* ``all_to_all``: ``bytes / (n(n-1))`` to every other node; each link carries ``bytes / n``.
* ``ring``: ``bytes / 2n`` to each neighbour; each link carries ``bytes / n``.
* ``scatter`` / ``gather``: ``bytes / n`` between the root and every other node; the
  root's link carries ``(n-1)/n · bytes``.
* ``master_worker``: ``2 · bytes / (n-1)`` both ways between the root and each worker;
  the root's links carry ``2 · bytes``.
* ``allreduce`` (ours, not ElastiSim's): ring all-reduce, ``2(n-1)`` steps of
  ``lat + bytes/(n·bw)``.
* ``none`` / ``""``: no communication.

On one node all patterns cost nothing.

**The PFS.** A job's unit of work is a list of *segments*: ``("time", seconds)`` for
computation, communication and latencies, and ``("pfs_read", bytes)`` /
``("pfs_write", bytes)`` (every node of the job moves its share: one flow per node) or
``("pfs_read_root", bytes)`` / ``("pfs_write_root", bytes)`` (the root node alone) for
transfers through the PFS. The engine runs transfers as flows of the flow-level network
(:mod:`~hpcnb.batchsim.network`): each flow is bounded by
:attr:`Platform.pfs_flow_bandwidth` (its node's link and the TCP window over the route)
and crosses the PFS read or write link, shared max-min fairly with the flows of every
other job active at the moment.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcnb.batchsim.nodes import Topology
from hpcnb.errors import InvalidInputError

__all__ = [
    "COMMUNICATION_PATTERNS",
    "COMM_KINDS",
    "SEGMENT_KINDS",
    "Platform",
    "Segment",
    "merge_segments",
    "nominal_duration",
    "parse_quantity",
    "read_platform_xml",
    "simgrid_platform_xml",
]

COMMUNICATION_PATTERNS = (
    "all_to_all",
    "ring",
    "allreduce",
    "scatter",
    "gather",
    "master_worker",
    "none",
    "",
)


@dataclass(frozen=True)
class Platform:
    """A homogeneous cluster.

    Attributes:
        num_nodes: Number of compute nodes.
        node_flops: CPU speed of a node (flop/s).
        gpus_per_node: GPUs per node (0 for none).
        gpu_flops: Speed of one GPU (flop/s).
        link_bandwidth: Bandwidth of a node's network link (bytes/s).
        link_latency: Latency of a message (s).
        pfs_read_bandwidth: Aggregate PFS read bandwidth shared by all jobs (bytes/s).
        pfs_write_bandwidth: Aggregate PFS write bandwidth shared by all jobs (bytes/s).
        pfs_latency: Latency of a PFS request (s).
        bb_read_bandwidth: Read bandwidth of each node's burst buffer (bytes/s; 0: none).
        bb_write_bandwidth: Write bandwidth of each node's burst buffer (bytes/s; 0: none).
        bb_wide_striping: Whether a job's burst buffers form one shared, striped buffer
            (ElastiSim's ``wide_striping``) instead of node-local ones.
        bb_flops_per_byte: CPU work per striped byte (ElastiSim's ``flops_per_byte``).
        topology: How the nodes are wired (``None``: a crossbar, nodes not grouped).
        tcp_gamma: SimGrid's TCP window (``network/TCP-gamma``, bytes): a flow over a
            route of latency ``L`` moves at most ``tcp_gamma / (2L)`` bytes/s; 0: no bound.
        hosts: Host names of the nodes (from a platform file), for per-node output.
    """

    num_nodes: int
    node_flops: float = 100e9
    gpus_per_node: int = 0
    gpu_flops: float = 0.0
    link_bandwidth: float = 100e9 / 8
    link_latency: float = 50e-6
    pfs_read_bandwidth: float = 80e9
    pfs_write_bandwidth: float = 50e9
    pfs_latency: float = 500e-6
    bb_read_bandwidth: float = 0.0
    bb_write_bandwidth: float = 0.0
    bb_wide_striping: bool = False
    bb_flops_per_byte: float = 0.0
    topology: Topology | None = None
    tcp_gamma: float = 4194304.0
    hosts: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if int(self.num_nodes) != self.num_nodes or self.num_nodes < 1:
            raise InvalidInputError(
                f"Platform.num_nodes={self.num_nodes}: expected an integer >= 1"
            )
        for name in ("node_flops", "link_bandwidth", "pfs_read_bandwidth", "pfs_write_bandwidth"):
            if getattr(self, name) <= 0:
                raise InvalidInputError(f"Platform.{name}={getattr(self, name)}: expected > 0")
        for name in ("bb_read_bandwidth", "bb_write_bandwidth", "bb_flops_per_byte", "tcp_gamma"):
            if not getattr(self, name) >= 0:
                raise InvalidInputError(f"Platform.{name}={getattr(self, name)}: expected >= 0")
        if self.gpus_per_node < 0:
            raise InvalidInputError(f"Platform.gpus_per_node={self.gpus_per_node}: expected >= 0")

    @property
    def has_burst_buffers(self) -> bool:
        """Whether the nodes have burst buffers (both bandwidths set)."""
        return self.bb_read_bandwidth > 0 and self.bb_write_bandwidth > 0

    def burst_buffer_time(self, nbytes: float, write: bool, nodes: int) -> float:
        """Return the time (s) for each of ``nodes`` ranks to move ``nbytes`` of its own.

        Node-local buffers: ``nbytes / bandwidth`` on the rank's own buffer. Wide
        striping (ElastiSim's shared burst buffer over the job's nodes): each rank
        keeps ``1/n`` of its data locally and sends the rest to the other ``n - 1``
        buffers (an all-to-all), paying ``bb_flops_per_byte`` of CPU per byte striped;
        the slowest of the three sets the time.

        Args:
            nbytes: Bytes each rank moves.
            write: A write (``True``) or a read.
            nodes: Ranks (nodes) of the job.

        Raises:
            InvalidInputError: The platform has no burst buffers.
        """
        if not self.has_burst_buffers:
            raise InvalidInputError(
                "a burst-buffer task on a platform without burst buffers "
                "(node_local_bb, bb_read_bw, bb_write_bw)"
            )
        bandwidth = self.bb_write_bandwidth if write else self.bb_read_bandwidth
        if not self.bb_wide_striping or nodes <= 1:
            return nbytes / bandwidth
        part = nbytes / nodes
        stripe = self.communication_time("all_to_all", part * nodes * (nodes - 1), nodes)
        return max(part / bandwidth, stripe, self.bb_flops_per_byte * nbytes / self.node_flops)

    @property
    def num_gpus(self) -> int:
        """Total GPUs of the machine."""
        return self.num_nodes * self.gpus_per_node

    @property
    def node_route_latency(self) -> float:
        """Latency of a route between two nodes: the sender's and the receiver's link (s)."""
        return 2 * self.link_latency

    @property
    def pfs_route_latency(self) -> float:
        """Latency of a route between a node and the PFS: its link and the PFS link (s)."""
        return self.link_latency + self.pfs_latency

    def window_time(self, nbytes: float, latency: float) -> float:
        """Return the TCP-window bound on moving ``nbytes`` over a route (``ptask_L07``).

        Args:
            nbytes: Bytes of the transfer.
            latency: Latency of its route (s).
        """
        if self.tcp_gamma <= 0 or nbytes <= 0:
            return 0.0
        return 2.0 * latency * nbytes / self.tcp_gamma

    @property
    def pfs_flow_bandwidth(self) -> float:
        """Largest rate of one node's PFS transfer (bytes/s): its link and the TCP window.

        A route without latency has no window bound (``ptask_L07`` bounds a task only when
        the largest ``latency × bytes`` of its transfers is positive).
        """
        if self.tcp_gamma <= 0 or self.pfs_route_latency <= 0:
            return self.link_bandwidth
        return min(self.link_bandwidth, self.tcp_gamma / (2.0 * self.pfs_route_latency))

    def communication_time(self, pattern: str, total_bytes: float, nodes: int) -> float:
        """Return the time (s) of one collective among ``nodes`` nodes (``ptask_L07``).

        The route latency, then the busiest link's bytes over its bandwidth or the TCP
        window bound of the largest pair payload, whichever is longer (see the module
        docstring for the payloads of each pattern).

        Args:
            pattern: One of :data:`COMMUNICATION_PATTERNS` (see the module docstring).
            total_bytes: Total payload of the collective (bytes).
            nodes: Nodes taking part.

        Raises:
            InvalidInputError: Unknown pattern.
        """
        if pattern not in COMMUNICATION_PATTERNS:
            raise InvalidInputError(
                f"communication pattern {pattern!r}: expected one of {COMMUNICATION_PATTERNS}"
            )
        if nodes <= 1 or total_bytes <= 0 or pattern in ("none", ""):
            return 0.0
        lat, bw, n, b = self.link_latency, self.link_bandwidth, nodes, total_bytes
        if pattern == "allreduce":
            return 2 * (n - 1) * (lat + b / (n * bw))
        if pattern == "all_to_all":
            link, pair = b / n, b / (n * (n - 1))
        elif pattern == "ring":  # both neighbours are one node when n == 2
            link, pair = b / n, (b / (2 * n) if n > 2 else b / n)
        elif pattern == "master_worker":
            link, pair = 2 * b, 2 * b / (n - 1)
        else:  # scatter / gather
            link, pair = (n - 1) / n * b, b / n
        route = self.node_route_latency
        return route + max(link / bw, self.window_time(pair, route))

    def pfs_time(self, total_bytes: float, write: bool, sharers: int = 1) -> float:
        """Return the time (s) to move ``total_bytes`` through the PFS.

        The aggregate bandwidth is divided equally among ``sharers`` jobs doing I/O.

        Args:
            total_bytes: Bytes moved.
            write: A write (``True``) or a read.
            sharers: Jobs doing PFS I/O at the same time (at least 1 counts).
        """
        bandwidth = self.pfs_write_bandwidth if write else self.pfs_read_bandwidth
        return self.pfs_latency + total_bytes * max(1, sharers) / bandwidth


_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_QUANTITY = re.compile(r"^\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*$")
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "ps": 1e-12, "m": 60.0, "h": 3600.0}


def parse_quantity(text: str, kind: str, where: str = "") -> float:
    """Convert a SimGrid quantity (``100Gf``, ``100Gbps``, ``80GBps``, ``50us``) to SI.

    Args:
        text: The attribute value.
        kind: ``"speed"`` (→ flop/s), ``"bandwidth"`` (→ bytes/s) or ``"time"`` (→ s).
        where: Context for the error message (file and element).

    Raises:
        InvalidInputError: The value or its unit is not understood.
    """
    match = _QUANTITY.match(text)
    if match is None:
        raise InvalidInputError(f"{where}: {kind} {text!r} is not a number with a unit")
    value, unit = float(match.group(1)), match.group(2)
    if kind == "time":
        if unit == "":
            return value
        if unit in _TIME:
            return value * _TIME[unit]
    elif kind == "speed":
        base = unit[:-1] if unit.endswith("f") else None
        if base is not None and base in _PREFIX:
            return value * _PREFIX[base]
        if unit == "":
            return value
    elif kind == "bandwidth":
        for suffix, scale in (("Bps", 1.0), ("bps", 1 / 8)):
            if unit.endswith(suffix):
                prefix = unit[: -len(suffix)]
                factor = _BINARY.get(prefix, _PREFIX.get(prefix))
                if factor is not None:
                    return value * factor * scale
        if unit == "":
            return value
    raise InvalidInputError(f"{where}: {kind} {text!r} has an unknown unit {unit!r}")


def _radical_count(radical: str, where: str) -> int:
    total = 0
    for part in radical.split(","):
        lo, sep, hi = part.partition("-")
        try:
            total += (int(hi) - int(lo) + 1) if sep else 1
        except ValueError:
            raise InvalidInputError(f"{where}: radical {radical!r} is not like '0-127'") from None
    return total


#: Machines up to this size get host names from the platform file (per-node output).
MAX_NAMED_HOSTS = 1_000_000


def _radical_ids(radical: str) -> list[int]:
    ids: list[int] = []
    for part in radical.split(","):
        lo, sep, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return ids


def _cluster_topology(cluster: ET.Element, n: int, bw: float, where: str) -> Topology | None:
    """SimGrid's ``topology`` / ``topo_parameters`` of a cluster, as our two-level model.

    ``FAT_TREE`` ``"2;d1,d2;u1,u2;p1,p2"``: leaves of ``d1`` nodes, each with ``u2 · p2``
    links up. ``DRAGONFLY`` ``"g,gl;c,cl;r,rl;nodes"``: groups of ``c · r · nodes``
    nodes, each with ``(g - 1) · gl`` global links. Other levels are folded into these.
    """
    kind = (cluster.get("topology") or "").upper()
    if kind in ("", "FLAT"):
        return None
    params = cluster.get("topo_parameters", "")
    try:
        parts = [[int(x) for x in p.split(",")] for p in params.split(";")]
        if kind == "FAT_TREE":
            down, up, links = parts[1], parts[2], parts[3]
            return Topology.fat_tree(n, min(down[0], n), up[-1] * links[-1], bw)
        if kind == "DRAGONFLY":
            (g, gl), (c, _), (r, _), (nodes,) = parts
            return Topology.dragonfly(c * r * nodes, max(1, (g - 1) * gl), bw)
    except (ValueError, IndexError):
        raise InvalidInputError(
            f"{where}: topo_parameters {params!r} not understood for {kind}"
        ) from None
    raise InvalidInputError(f"{where}: topology {kind!r}: expected FLAT, FAT_TREE or DRAGONFLY")


def read_platform_xml(path: str | Path, gpus_per_node: int = 0) -> Platform:
    """Read the SimGrid platform subset used by ElastiSim's example.

    Supported: one ``<cluster>`` (``prefix``, ``radical``, ``suffix``, ``speed``, ``bw``,
    ``lat``, ``topology`` ``FAT_TREE`` / ``DRAGONFLY`` with ``topo_parameters``) for the
    compute nodes, whose host names are kept for per-node output, and ``<link>`` elements
    whose ids are named as PFS read / write links (``PFS_read`` / ``PFS_write``, matched
    case-insensitively on ``read`` / ``write``).

    Args:
        path: The platform XML file.
        gpus_per_node: GPUs of each node (the file does not describe them).

    Raises:
        InvalidInputError: No cluster, or an attribute with an unknown unit; the message names
            the file and element.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise InvalidInputError(f"{path}: not a valid platform XML ({exc})") from exc
    clusters = list(root.iter("cluster"))
    if not clusters:
        raise InvalidInputError(f"{path}: no <cluster> element (expected the compute nodes)")
    cluster = clusters[0]
    where = f"{path}: <cluster id={cluster.get('id')!r}>"
    for attribute in ("radical", "speed"):
        if cluster.get(attribute) is None:
            raise InvalidInputError(f"{where}: missing attribute {attribute!r}")
    kwargs: dict[str, Any] = {
        "num_nodes": _radical_count(cluster.get("radical", ""), where),
        "node_flops": parse_quantity(cluster.get("speed", ""), "speed", where),
        "gpus_per_node": gpus_per_node,
    }
    if cluster.get("bw"):
        kwargs["link_bandwidth"] = parse_quantity(cluster.get("bw", ""), "bandwidth", where)
    if cluster.get("lat"):
        kwargs["link_latency"] = parse_quantity(cluster.get("lat", ""), "time", where)
    n = int(kwargs["num_nodes"])
    if n <= MAX_NAMED_HOSTS:
        prefix, suffix = cluster.get("prefix", ""), cluster.get("suffix", "")
        ids = _radical_ids(cluster.get("radical", ""))
        kwargs["hosts"] = tuple(f"{prefix}{i}{suffix}" for i in ids)
    props = {p.get("id", ""): p.get("value", "") for p in cluster.iter("prop")}
    if props.get("node_local_bb", "").lower() == "true":
        for key, attr in (
            ("bb_read_bw", "bb_read_bandwidth"),
            ("bb_write_bw", "bb_write_bandwidth"),
        ):
            if key not in props:
                raise InvalidInputError(
                    f"{where}: node_local_bb is true but prop {key!r} is missing"
                )
            kwargs[attr] = parse_quantity(props[key], "bandwidth", f"{where} prop {key}")
        kwargs["bb_wide_striping"] = props.get("wide_striping", "").lower() == "true"
        if kwargs["bb_wide_striping"]:
            try:
                kwargs["bb_flops_per_byte"] = float(props.get("flops_per_byte", "0"))
            except ValueError:
                value = props.get("flops_per_byte")
                reason = f"prop flops_per_byte {value!r} is not a number"
                raise InvalidInputError(f"{where}: {reason}") from None
    bw = float(kwargs.get("link_bandwidth", Platform.link_bandwidth))
    kwargs["topology"] = _cluster_topology(cluster, n, bw, where)
    for link in root.iter("link"):
        name = (link.get("id") or "").lower()
        if "pfs" not in name:
            continue
        lwhere = f"{path}: <link id={link.get('id')!r}>"
        bandwidth = parse_quantity(link.get("bandwidth", ""), "bandwidth", lwhere)
        if "read" in name:
            kwargs["pfs_read_bandwidth"] = bandwidth
        elif "write" in name:
            kwargs["pfs_write_bandwidth"] = bandwidth
        if link.get("latency"):
            kwargs["pfs_latency"] = parse_quantity(link.get("latency", ""), "time", lwhere)
    return Platform(**kwargs)


def simgrid_platform_xml(
    radical: str,
    speed: str,
    bw: str,
    lat: str,
    pfs_read: str,
    pfs_write: str,
    pfs_latency: str,
) -> str:
    """Return a SimGrid platform document of the subset :func:`read_platform_xml` reads.

    One full-routing zone with one ``<cluster>`` of compute nodes and the ``PFS_read`` /
    ``PFS_write`` links. Quantities are SimGrid strings, written as given.

    Args:
        radical: Node numbers of the cluster (``"0-127"``, ``"0-3,8"``).
        speed: Node speed (``"100Gf"``).
        bw: Bandwidth of a node's link (``"100Gbps"``).
        lat: Latency of a message (``"50us"``).
        pfs_read: PFS read bandwidth (``"80GBps"``).
        pfs_write: PFS write bandwidth (``"50GBps"``).
        pfs_latency: Latency of a PFS request (``"500us"``).

    Example:
        >>> text = simgrid_platform_xml("0-3", "2Gf", "8Gbps", "10us", "4GBps", "2GBps", "1ms")
        >>> text.splitlines()[2]
        '<cluster id="C" prefix="n" radical="0-3" suffix="" speed="2Gf" bw="8Gbps" lat="10us"/>'
    """
    cluster = (
        f'<cluster id="C" prefix="n" radical="{radical}" suffix="" speed="{speed}" '
        f'bw="{bw}" lat="{lat}"/>'
    )
    links = [
        f'<link id="PFS_{kind}" bandwidth="{bandwidth}" latency="{pfs_latency}"/>'
        for kind, bandwidth in (("read", pfs_read), ("write", pfs_write))
    ]
    lines = [
        "<?xml version='1.0'?>",
        '<platform version="4.1"><zone id="z" routing="Full">',
        cluster,
        *links,
        "</zone></platform>",
    ]
    return "\n".join(lines) + "\n"


Segment = tuple[str, float]
COMM_KINDS = tuple(f"comm_{p}" for p in COMMUNICATION_PATTERNS if p not in ("", "none"))
SEGMENT_KINDS = (
    "time",
    "pfs_read",
    "pfs_write",
    "pfs_read_root",
    "pfs_write_root",
    "compute",
    *COMM_KINDS,
)
"""``time`` (seconds), PFS transfers by every node of the job (``pfs_read`` / ``pfs_write``:
one flow per node, bytes in total) or by its root node only (``..._root``: one flow), and
on a platform with a topology a parallel task: ``compute`` (seconds) followed by
``comm_<pattern>`` (bytes of the collective), which the engine runs together as one flow
over the links of the job's nodes."""


def merge_segments(segments: list[Segment], where: str = "") -> list[Segment]:
    """Validate segments, drop empty ones and merge consecutive ``time`` segments.

    Args:
        segments: ``(kind, amount)`` pairs, kinds of :data:`SEGMENT_KINDS`.
        where: Context for the error message (job and unit).

    Returns:
        The non-empty segments, amounts as floats.

    Raises:
        InvalidInputError: Unknown kind or an amount that is negative or not finite.
    """
    out: list[Segment] = []
    for kind, amount in segments:
        if kind not in SEGMENT_KINDS:
            raise InvalidInputError(
                f"{where}: segment kind {kind!r}, expected one of {SEGMENT_KINDS}"
            )
        if not (amount >= 0 and math.isfinite(amount)):
            raise InvalidInputError(f"{where}: {kind} segment of {amount} (expected finite >= 0)")
        if amount == 0:
            continue
        if out and kind == "time" and out[-1][0] == "time":
            out[-1] = ("time", out[-1][1] + amount)
        else:
            out.append((kind, float(amount)))
    return out


def nominal_duration(
    segments: list[Segment], read_bandwidth: float, write_bandwidth: float, sharers: int = 1
) -> float:
    """Return the duration of segments if each PFS link were shared by ``sharers`` jobs.

    Collectives (``comm_*`` segments) are left out of this estimate.

    Args:
        segments: Segments as :func:`merge_segments` returns them.
        read_bandwidth: PFS read bandwidth (bytes/s).
        write_bandwidth: PFS write bandwidth (bytes/s).
        sharers: Jobs sharing each PFS link (at least 1 counts).
    """
    total = 0.0
    for kind, amount in segments:
        if kind in ("time", "compute"):
            total += amount
        elif kind.startswith("comm_"):  # the estimate leaves collectives out
            continue
        else:
            bandwidth = read_bandwidth if kind.startswith("pfs_read") else write_bandwidth
            total += amount * max(1, sharers) / bandwidth
    return total
