"""Fork-join training of several subnets on shared weights.

One training step on ``K`` subnets:

* **fork** — each worker copies the current shared weights into its subnet
  (:meth:`SubnetBinding.pull`) and computes the subnet's loss and gradients;
* **join** — every worker adds its gradients into a flat *gradient-sum* vector and a
  flat *coverage-count* vector (how many subnets use each supernet element); the two are
  summed over workers (an MPI ``Allreduce`` when a communicator is given) and each
  supernet element gets the mean gradient of the subnets that cover it;
* one optimiser step on the supernet.

The join is a **fixed-order reduction** (``join="canonical"``, the default): every subnet's
gradient and coverage vectors are computed on their own, in float64
(:func:`subnet_gradients`; the distillation teacher is always the largest subnet's
gradient-free forward, whichever worker computes it), gathered from all workers, and summed
in the order of the subnets' indices in the step (:func:`canonical_join`). Each subnet's
vectors do not depend on which worker computed them, and the order of the sum does not
depend on how many workers there are or in which order they arrive, so the joined
gradients are **bitwise identical** for 1, 2 or 4 ranks and any arrival order
(:func:`join_digest` hashes them; :func:`bitwise_join_check` checks it). The older
``join="allreduce"`` sums per-worker float64 vectors with one MPI ``Allreduce``: equal up
to float64 rounding, not bitwise. The naive alternative, in which each worker
takes its own optimiser step and writes its subnet's weights back, is a write-after-write
hazard: overlapping elements keep the value of whoever wrote last
(:func:`last_writer_step`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hpcnb.errors import InvalidInputError
from hpcnb.torchcompat import safe_backward

from .space import SubnetConfig

if TYPE_CHECKING:  # pragma: no cover
    from .supernet import Supernet

__all__ = [
    "PHASES",
    "LocalResult",
    "StepPhases",
    "assign_subnets",
    "bitwise_join_check",
    "canonical_join",
    "coverage_average",
    "distill_loss",
    "fork_join_step",
    "join_digest",
    "join_order_demo",
    "last_writer_step",
    "local_gradients",
    "subnet_gradients",
]


PHASES = ("compute", "wait", "allreduce", "update")


@dataclass
class StepPhases:
    """Seconds spent in each phase of every fork-join step on one worker.

    Phases of one step (:func:`fork_join_step` with ``phases=``):

    * ``compute`` — the fork: this worker's subnets' forward and backward passes and the
      gradient sums (:func:`local_gradients`);
    * ``wait`` — an MPI ``Barrier`` right after the compute: the time this worker waits for
      the slowest one (load imbalance); zero without a communicator;
    * ``allreduce`` — the ``Allreduce`` of gradient sums and coverage counts, every
      worker having arrived; zero without a communicator;
    * ``update`` — the coverage-count average and the optimiser step.

    Attributes:
        compute: Seconds per step.
        wait: Seconds per step.
        allreduce: Seconds per step.
        update: Seconds per step.
    """

    compute: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    allreduce: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Number of steps timed."""
        return len(self.compute)

    def add(self, compute: float, wait: float, allreduce: float, update: float) -> None:
        """Append the phase durations (seconds) of one step.

        Args:
            compute: This worker's forward and backward passes and gradient sums.
            wait: The barrier after the compute (waiting for the slowest worker).
            allreduce: The all-reduce of gradient sums and coverage counts.
            update: The coverage-count average and the optimiser step.
        """
        for name, value in zip(PHASES, (compute, wait, allreduce, update), strict=True):
            getattr(self, name).append(float(value))

    def totals(self) -> dict[str, float]:
        """Seconds per phase summed over the steps."""
        return {name: float(sum(getattr(self, name))) for name in PHASES}

    def mean_per_step(self) -> dict[str, float]:
        """Mean seconds per step of each phase (zeros when no step was timed)."""
        n = max(1, self.steps)
        return {name: total / n for name, total in self.totals().items()}

    def to_json(self) -> dict[str, list[float]]:
        """The per-step lists, JSON-serialisable."""
        return {name: list(getattr(self, name)) for name in PHASES}

    @classmethod
    def from_json(cls, data: dict[str, Sequence[float]]) -> StepPhases:
        """Rebuild from :meth:`to_json` output."""
        return cls(**{name: [float(v) for v in data.get(name, ())] for name in PHASES})


@dataclass
class LocalResult:
    """Gradient sums, coverage counts and losses of the subnets one worker trained.

    Attributes:
        sums: Flat float64 gradient sums over this worker's subnets.
        counts: Flat float64 coverage counts.
        losses: Loss per subnet, in the worker's order.
    """

    sums: torch.Tensor
    counts: torch.Tensor
    losses: list[float]


def distill_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    teacher: torch.Tensor | None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Cross-entropy on labels, or KL divergence to soft teacher targets.

    Args:
        logits: Student outputs ``(batch, classes)``.
        targets: Integer labels ``(batch,)``.
        teacher: Teacher logits (detached) or ``None`` for plain cross-entropy.
        temperature: Softmax temperature of the distillation.
    """
    if teacher is None:
        return F.cross_entropy(logits, targets)
    t = temperature
    return F.kl_div(
        F.log_softmax(logits / t, dim=-1),
        F.softmax(teacher / t, dim=-1),
        reduction="batchmean",
    ) * (t * t)


def local_gradients(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    distill: bool = True,
    teacher_logits: torch.Tensor | None = None,
) -> LocalResult:
    """Fork: train-step computations of several subnets from the same shared weights.

    With ``distill`` (in-place distillation, the sandwich rule), the largest subnet is
    trained on the labels and every other subnet on the largest subnet's soft outputs for
    the same batch. When the largest subnet is not among ``configs``, its outputs are
    computed without gradients so that every worker sees the same teacher.

    Args:
        supernet: The supernet (weights are read, not written).
        configs: Subnets this worker trains.
        x: Input batch.
        y: Labels.
        distill: Use in-place distillation.
        teacher_logits: Fixed teacher outputs for ``x`` (overrides in-place distillation).

    Returns:
        Float64 gradient sums and coverage counts over the supernet's flat parameters.
    """
    flat = supernet.flat
    sums = torch.zeros(flat.numel, dtype=torch.float64)
    counts = torch.zeros(flat.numel, dtype=torch.float64)
    losses: list[float] = []
    big = supernet.space.max()
    teacher = teacher_logits
    order = sorted(range(len(configs)), key=lambda i: configs[i] != big)  # max first
    results: dict[int, float] = {}
    for i in order:
        config = configs[i]
        binding = supernet.bind(config)
        module = binding.pull()
        module.train()
        if distill and teacher is None and config != big:
            with torch.no_grad():
                teacher = supernet.bind(big).pull()(x).detach()
        out = module(x)
        use_teacher: torch.Tensor | None
        if teacher_logits is not None:
            use_teacher = teacher_logits
        else:
            use_teacher = teacher if distill and config != big else None
        loss = distill_loss(out, y, use_teacher)
        with safe_backward():
            loss.backward()
        binding.push_grad(sums, counts)
        if distill and config == big and teacher_logits is None:
            teacher = out.detach()
        results[i] = float(loss.detach())
    losses = [results[i] for i in range(len(configs))]
    return LocalResult(sums, counts, losses)


def subnet_gradients(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    indices: Sequence[int],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    distill: bool = True,
    teacher_logits: torch.Tensor | None = None,
) -> dict[int, tuple[torch.Tensor, torch.Tensor, float]]:
    """Fork, one subnet at a time: float64 gradient and coverage vectors per subnet.

    The teacher of in-place distillation is always the largest subnet's forward without
    gradients (the same computation on every worker), so a subnet's vectors do not depend
    on which worker computes them or on what else that worker trains.

    Args:
        supernet: The supernet (weights are read, not written).
        configs: All subnets of the step.
        indices: The indices into ``configs`` that this worker trains.
        x: Input batch.
        y: Labels.
        distill: Use in-place distillation (the largest subnet learns from the labels).
        teacher_logits: Fixed teacher outputs for ``x`` (overrides in-place distillation).

    Returns:
        ``{index: (gradient sums, coverage counts, loss)}``.
    """
    big = supernet.space.max()
    teacher = teacher_logits
    if distill and teacher is None and any(configs[i] != big for i in indices):
        with torch.no_grad():
            module = supernet.bind(big).pull()
            module.train()
            teacher = module(x).detach()
    out: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for i in indices:
        config = configs[i]
        binding = supernet.bind(config)
        module = binding.pull()
        module.train()
        use_teacher: torch.Tensor | None
        if teacher_logits is not None:
            use_teacher = teacher_logits
        else:
            use_teacher = teacher if distill and config != big else None
        loss = distill_loss(module(x), y, use_teacher)
        with safe_backward():
            loss.backward()
        sums = torch.zeros(supernet.flat.numel, dtype=torch.float64)
        counts = torch.zeros(supernet.flat.numel, dtype=torch.float64)
        binding.push_grad(sums, counts)
        out[int(i)] = (sums, counts, float(loss.detach()))
    return out


def canonical_join(
    parts: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Join: sum per-subnet vectors in the order of the subnet indices, whatever arrived when.

    Args:
        parts: ``{subnet index: (gradient sums, coverage counts, loss)}`` from all workers.

    Returns:
        ``(gradient sums, coverage counts)`` in float64.

    Raises:
        InvalidInputError: ``parts`` is empty.
    """
    if not parts:
        raise InvalidInputError("canonical_join: no subnet contributions")
    first = next(iter(parts.values()))
    sums = torch.zeros_like(first[0])
    counts = torch.zeros_like(first[1])
    for i in sorted(parts):
        sums += parts[i][0]
        counts += parts[i][1]
    return sums, counts


def join_digest(sums: torch.Tensor, counts: torch.Tensor) -> str:
    """SHA-256 of the joined vectors' bytes: equal digests mean bitwise-equal joins.

    Args:
        sums: Joined gradient sums over the flat parameters.
        counts: Joined coverage counts over the flat parameters.
    """
    h = hashlib.sha256()
    for t in (sums, counts):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def bitwise_join_check(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    ranks: Sequence[int] = (1, 2, 4),
    orders: int = 3,
    distill: bool = True,
    seed: int = 0,
) -> dict[str, object]:
    """Join one step's gradients as ``W`` ranks would, in shuffled arrival orders, and hash.

    For every rank count the subnets are split as :func:`fork_join_step` splits them
    (:func:`assign_subnets`); each simulated rank computes its share
    (:func:`subnet_gradients`); the ranks' contributions arrive in ``orders`` random orders
    and are joined with :func:`canonical_join`. For contrast, the same contributions are
    also summed in arrival order in float32 (a naive accumulation).

    Args:
        supernet: The supernet (not modified).
        configs: The step's subnets.
        x: Input batch.
        y: Labels.
        ranks: Rank counts to simulate.
        orders: Shuffled arrival orders per rank count.
        distill: In-place distillation.
        seed: Seed of the shuffles.

    Returns:
        ``{"digests": {(ranks, order): digest}, "identical": bool, "naive_distinct": int}``
        where ``naive_distinct`` counts the distinct digests of the naive float32 sums.
    """
    rng = torch.Generator().manual_seed(seed)
    digests: dict[tuple[int, int], str] = {}
    naive: set[str] = set()
    for w in ranks:
        parts = assign_subnets(supernet, configs, w, distill=distill)
        per_rank = [
            subnet_gradients(supernet, configs, share, x, y, distill=distill) for share in parts
        ]
        for k in range(orders):
            arrival = torch.randperm(w, generator=rng).tolist()
            gathered: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
            for r in arrival:
                gathered.update(per_rank[r])
            digests[(w, k)] = join_digest(*canonical_join(gathered))
            flat = [per_rank[r][i] for r in arrival for i in per_rank[r]]
            sums32 = torch.zeros_like(flat[0][0], dtype=torch.float32)
            for part in flat:
                sums32 += part[0].float()
            naive.add(join_digest(sums32, torch.zeros(0)))
    return {
        "digests": digests,
        "identical": len(set(digests.values())) == 1,
        "naive_distinct": len(naive),
    }


def assign_subnets(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    workers: int,
    *,
    distill: bool = True,
) -> list[list[int]]:
    """Split a step's subnets over workers by estimated cost (longest processing time first).

    A subnet's cost is ``3 × FLOPs`` (forward and backward); with in-place distillation a
    worker without the largest subnet pays one extra forward of it for the teacher. The
    split is deterministic, so every rank computes the same one.

    Args:
        supernet: The supernet (for FLOPs).
        configs: The step's subnets.
        workers: Number of workers.
        distill: Whether the teacher forward is needed.

    Returns:
        For each worker, the indices into ``configs`` it trains.
    """
    if workers < 1:
        raise InvalidInputError(f"workers={workers}: expected >= 1")
    big = supernet.space.max()
    teacher = float(supernet.flops(big)) if distill else 0.0
    cost = [3.0 * supernet.flops(c) for c in configs]
    parts: list[list[int]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    has_big = [False] * workers
    for i in sorted(range(len(configs)), key=lambda i: (-cost[i], i)):

        def total(w: int, i: int = i) -> float:
            extra = teacher if (teacher and not has_big[w] and configs[i] != big) else 0.0
            extra = extra if not any(configs[j] != big for j in parts[w]) else 0.0
            return load[w] + cost[i] + extra

        w = min(range(workers), key=lambda w: (total(w), w))
        load[w] = total(w)
        parts[w].append(i)
        has_big[w] = has_big[w] or configs[i] == big
    return [sorted(p) for p in parts]


def coverage_average(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Return the per-element mean gradient over the subnets that cover each element.

    Elements no subnet covers get a zero gradient.

    Args:
        sums: Gradient sums over the flat parameters.
        counts: How many subnets covered each element.
    """
    return torch.where(counts > 0, sums / counts.clamp_min(1.0), torch.zeros_like(sums))


def _gather_parts(
    comm: Any, parts: dict[int, tuple[torch.Tensor, torch.Tensor, float]]
) -> dict[int, tuple[torch.Tensor, torch.Tensor, float]]:
    mine = {i: (s.numpy(), c.numpy(), loss) for i, (s, c, loss) in parts.items()}
    out: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for theirs in comm.allgather(mine):
        for i, (s, c, loss) in theirs.items():
            out[int(i)] = (torch.from_numpy(s), torch.from_numpy(c), loss)
    return out


def _allreduce(comm: Any, local: LocalResult) -> tuple[torch.Tensor, torch.Tensor]:
    from mpi4py import MPI

    buf = torch.cat([local.sums, local.counts]).numpy()
    out = buf.copy()
    comm.Allreduce(buf, out, op=MPI.SUM)
    n = local.sums.numel()
    total = torch.from_numpy(out)
    return total[:n], total[n:]


def fork_join_step(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    comm: Any = None,
    distill: bool = True,
    teacher_logits: torch.Tensor | None = None,
    phases: StepPhases | None = None,
    join: str = "canonical",
) -> list[float]:
    """One fork-join step: subnets' gradients joined by coverage-count average, one update.

    Without ``comm`` all subnets run here in turn. With an ``mpi4py`` communicator of size
    ``W``, rank ``r`` trains its share from :func:`assign_subnets`. With
    ``join="canonical"`` every rank's per-subnet vectors are gathered (``allgather``) and
    summed in subnet order (:func:`canonical_join`): the joined gradients are bitwise the
    same for any ``W`` and arrival order. With ``join="allreduce"`` each rank's float64
    sums and counts are added by one ``Allreduce`` (equal up to rounding). Every rank then
    applies the same optimiser step, so the shared weights stay identical on all ranks.

    With ``phases``, the step's compute, wait, all-reduce and update times
    (``time.perf_counter``) are appended to it; to separate waiting for the slowest rank
    from the all-reduce itself, a timed MPI step puts a ``Barrier`` before the
    ``Allreduce`` (the weights are the same either way).

    Args:
        supernet: The supernet being trained.
        configs: The subnets of this step (the same list on every rank).
        x: Input batch (the same on every rank).
        y: Labels.
        optimizer: Optimiser over ``supernet.model.parameters()``.
        comm: Optional MPI communicator.
        distill: In-place distillation from the largest subnet.
        teacher_logits: Fixed teacher outputs for ``x``.
        phases: Optional :class:`StepPhases` that receives this step's phase times.
        join: ``"canonical"`` (fixed-order, bitwise reproducible) or ``"allreduce"``.

    Returns:
        The losses of the subnets this rank trained.
    """
    if join not in ("canonical", "allreduce"):
        raise InvalidInputError(
            f"fork_join_step: join={join!r}, expected 'canonical' or 'allreduce'"
        )
    t0 = time.perf_counter()
    if join == "canonical":
        multi = comm is not None and comm.Get_size() > 1
        if multi:
            parts = assign_subnets(supernet, configs, comm.Get_size(), distill=distill)
            mine = parts[comm.Get_rank()]
        else:
            mine = list(range(len(configs)))
        own = subnet_gradients(
            supernet, configs, mine, x, y, distill=distill, teacher_logits=teacher_logits
        )
        losses = [own[i][2] for i in mine]
        t_compute = time.perf_counter()
        if multi and phases is not None:
            comm.Barrier()
        t_wait = time.perf_counter()
        sums, counts = canonical_join(_gather_parts(comm, own) if multi else own)
        t_reduce = time.perf_counter()
        if not multi:
            t_wait = t_reduce = t_compute
        _average_and_step(supernet, optimizer, sums, counts)
        if phases is not None:
            phases.add(
                t_compute - t0,
                t_wait - t_compute,
                t_reduce - t_wait,
                time.perf_counter() - t_reduce,
            )
        return losses
    if comm is not None and comm.Get_size() > 1:
        parts = assign_subnets(supernet, configs, comm.Get_size(), distill=distill)
        mine = [configs[i] for i in parts[comm.Get_rank()]]
        local = local_gradients(
            supernet, mine, x, y, distill=distill, teacher_logits=teacher_logits
        )
        t_compute = time.perf_counter()
        if phases is not None:
            comm.Barrier()
        t_wait = time.perf_counter()
        sums, counts = _allreduce(comm, local)
        t_reduce = time.perf_counter()
    else:
        local = local_gradients(
            supernet, configs, x, y, distill=distill, teacher_logits=teacher_logits
        )
        sums, counts = local.sums, local.counts
        t_compute = t_wait = t_reduce = time.perf_counter()
    _average_and_step(supernet, optimizer, sums, counts)
    if phases is not None:
        phases.add(
            t_compute - t0, t_wait - t_compute, t_reduce - t_wait, time.perf_counter() - t_reduce
        )
    return local.losses


def _average_and_step(
    supernet: Supernet, optimizer: torch.optim.Optimizer, sums: torch.Tensor, counts: torch.Tensor
) -> None:
    """Write the coverage-count average of the joined gradients and take the optimizer step."""
    supernet.flat.refresh_grad_views()
    supernet.flat.grads.copy_(coverage_average(sums, counts).to(supernet.flat.grads.dtype))
    optimizer.step()


def last_writer_step(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    order: Sequence[int],
    *,
    distill: bool = False,
) -> torch.Tensor:
    """The naive join: each worker updates its own copy and writes it back in ``order``.

    Every subnet starts from the same shared weights, takes one SGD step of size ``lr``
    on its own copy, and its weights are then written into the shared vector, one worker
    after another in ``order``. Elements several subnets cover keep the last writer's
    value (a write-after-write hazard), so the result depends on the order.

    Args:
        supernet: The supernet (its weights are not modified).
        configs: One subnet per worker.
        x: Input batch.
        y: Labels.
        lr: SGD step size of each worker.
        order: Permutation of ``range(len(configs))``: the order of the write-backs.
        distill: Train non-largest subnets on the largest one's outputs.

    Returns:
        The new flat weight vector (a copy).
    """
    if sorted(order) != list(range(len(configs))):
        raise InvalidInputError(
            f"order={list(order)} is not a permutation of range({len(configs)})"
        )
    start = supernet.flat.params.clone()
    updates = []
    for config in configs:
        local = local_gradients(supernet, [config], x, y, distill=distill)
        binding = supernet.bind(config)
        codes = torch.cat([c.reshape(-1) for c in binding.param_codes.values()])
        new_vals = start[codes] - lr * local.sums[codes].to(start.dtype)
        updates.append((codes, new_vals))
    out = start.clone()
    for i in order:
        codes, vals = updates[i]
        out[codes] = vals
    return out


def join_order_demo(
    supernet: Supernet,
    configs: Sequence[SubnetConfig],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float = 0.05,
    orders: Sequence[Sequence[int]] = (),
    distill: bool = False,
) -> dict[str, float]:
    """Compare the coverage-count join with the last-writer write-back under worker orders.

    One worker per subnet. For every order, the workers' gradient sums and counts are
    joined in that order and one SGD step of size ``lr`` is taken; separately, each worker
    takes its own SGD step and writes its weights back in that order. The result holds the
    largest difference between any two orders for each scheme, and how far the last-writer
    result is from the joined one.

    Args:
        supernet: The supernet (not modified).
        configs: One subnet per worker.
        x: Input batch.
        y: Labels.
        lr: SGD step size.
        orders: Worker orders (default: identity, reversed and one random permutation).
        distill: In-place distillation.

    Returns:
        ``{"join_order_max_diff", "lastwriter_max_diff", "lastwriter_vs_join_max_diff",
        "overlap_fraction"}`` (the last is the fraction of covered elements covered by
        two or more subnets).
    """
    k = len(configs)
    if not orders:
        rng = torch.Generator().manual_seed(0)
        orders = [list(range(k)), list(range(k))[::-1], torch.randperm(k, generator=rng).tolist()]
    per_worker = [local_gradients(supernet, [c], x, y, distill=distill) for c in configs]
    start = supernet.flat.params.detach().double()
    joined, written = [], []
    for order in orders:
        sums = torch.zeros_like(per_worker[0].sums)
        counts = torch.zeros_like(per_worker[0].counts)
        for i in order:
            sums += per_worker[i].sums
            counts += per_worker[i].counts
        joined.append(start - lr * coverage_average(sums, counts))
        written.append(last_writer_step(supernet, configs, x, y, lr, order, distill=distill))
    total_counts = sum((r.counts for r in per_worker[1:]), per_worker[0].counts)
    covered = total_counts > 0
    return {
        "join_order_max_diff": max(float((a - joined[0]).abs().max()) for a in joined),
        "lastwriter_max_diff": max(
            float((a.double() - written[0].double()).abs().max()) for a in written
        ),
        "lastwriter_vs_join_max_diff": float((written[0].double() - joined[0]).abs().max()),
        "overlap_fraction": float((total_counts[covered] > 1).double().mean()),
    }
