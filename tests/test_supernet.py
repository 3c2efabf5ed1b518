"""Tests of hpcnb.supernet's generic machinery: space, sharing, join, samplers, search.

These use a tiny MLP with a hand-written extractor defined here (not in the package),
so they check the weight-sharing and fork-join logic independently of the IR; the
IR-based conversion of zoo models is tested in test_supernet_zoo.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from hpcnb.supernet import (
    Candidate,
    Dimension,
    PrioritizedSampler,
    SandwichSampler,
    SearchSpace,
    SubnetConfig,
    Supernet,
    SupernetTrainConfig,
    UniformSampler,
    evolutionary_search,
    exhaustive_search,
    finetune_subnet,
    train_supernet,
)
from hpcnb.supernet.forkjoin import (
    coverage_average,
    fork_join_step,
    join_order_demo,
    last_writer_step,
    local_gradients,
)
from hpcnb.supernet.pareto import pareto_ranks
from hpcnb.supernet.search import pareto_front
from hpcnb.supernet.space import width_choices
from hpcnb.supernet.training import selective_recall


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3)
    )


def _extract(model: nn.Module, keep: dict[str, int], skip: tuple[str, ...]) -> nn.Module:
    h1, h2 = keep["h1"], keep["h2"]
    small = nn.Sequential(
        nn.Flatten(), nn.Linear(12, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, 3)
    )
    with torch.no_grad():
        small[1].weight.copy_(model[1].weight[:h1])
        small[1].bias.copy_(model[1].bias[:h1])
        small[3].weight.copy_(model[3].weight[:h2, :h1])
        small[3].bias.copy_(model[3].bias[:h2])
        small[5].weight.copy_(model[5].weight[:, :h2])
        small[5].bias.copy_(model[5].bias)
    return small


def _flops(module: nn.Module, x: torch.Tensor) -> int:
    return sum(2 * m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def _supernet(seed: int = 0) -> Supernet:
    space = SearchSpace(
        [
            Dimension("h1", "width", width_choices(16, (0.25, 0.5, 0.75, 1.0)), 16),
            Dimension("h2", "width", width_choices(8, (0.25, 0.5, 1.0)), 8),
        ]
    )
    return Supernet(_mlp(seed), space, _extract, torch.zeros(1, 12), flop_counter=_flops)


def _data(n: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(3, (n,), generator=g)


def test_width_choices_and_space_operations() -> None:
    assert width_choices(16, (0.25, 0.5, 0.75, 1.0)) == (4, 8, 12, 16)
    assert width_choices(3, (0.1, 0.5)) == (1, 2, 3)
    with pytest.raises(ValueError, match="ratio"):
        width_choices(8, (0.0,))
    sn = _supernet()
    space = sn.space
    assert space.size() == 12
    assert len(list(space.enumerate())) == 12
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = space.mutate(space.sample(rng), rng)
        space.validate(c)
    with pytest.raises(ValueError, match="not in"):
        space.validate(SubnetConfig((5, 8)))


def test_extract_max_reproduces_supernet_and_subnets_are_smaller() -> None:
    sn = _supernet()
    x, _ = _data()
    ref = sn.model(x)
    out = sn.extract(sn.max())(x)
    assert torch.allclose(out, ref, atol=1e-6)
    small = sn.extract(sn.min())
    assert small(x).shape == (32, 3)
    assert sn.params(sn.min()) < sn.params(sn.max())
    assert sn.flops(sn.min()) < sn.flops(sn.max())
    # The binding maps the min subnet's first-layer weight to the supernet's leading rows.
    codes = sn.bind(sn.min()).param_codes["1.weight"]
    assert torch.equal(codes, torch.arange(4 * 12).view(4, 12))


def _autograd_reference(
    sn: Supernet, configs: list[SubnetConfig], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Coverage-average gradient by autograd through a differentiable gather."""
    flat = sn.flat.params.detach().clone().requires_grad_(True)
    counts = torch.zeros(flat.numel(), dtype=torch.float64)
    total = 0.0
    for c in configs:
        binding = sn.bind(c)
        params = {n: flat[codes] for n, codes in binding.param_codes.items()}
        total = total + F.cross_entropy(functional_call(binding.module, params, (x,)), y)
        for codes in binding.param_codes.values():
            counts.index_add_(0, codes.reshape(-1), torch.ones(codes.numel(), dtype=torch.float64))
    (grad,) = torch.autograd.grad(total, flat)
    return coverage_average(grad.double(), counts)


def test_join_equals_autograd_accumulation_and_is_order_invariant() -> None:
    sn = _supernet()
    x, y = _data()
    rng = np.random.default_rng(1)
    configs = [sn.max(), sn.min(), *[sn.sample(rng) for _ in range(4)]]
    local = local_gradients(sn, configs, x, y, distill=False)
    joined = coverage_average(local.sums, local.counts)
    ref = _autograd_reference(sn, configs, x, y)
    assert (joined - ref).abs().max().item() <= 1e-6
    # Coverage: the leading rows of layer 1 are covered by every subnet.
    assert local.counts[0].item() == len(configs)
    for perm in ([5, 4, 3, 2, 1, 0], [2, 0, 5, 1, 4, 3]):
        other = local_gradients(sn, [configs[i] for i in perm], x, y, distill=False)
        diff = (coverage_average(other.sums, other.counts) - joined).abs().max().item()
        assert diff <= 1e-12


def test_last_writer_write_back_depends_on_order() -> None:
    sn = _supernet()
    x, y = _data()
    configs = [sn.max(), sn.min(), SubnetConfig((8, 4))]
    a = last_writer_step(sn, configs, x, y, lr=0.1, order=[0, 1, 2])
    b = last_writer_step(sn, configs, x, y, lr=0.1, order=[2, 1, 0])
    assert (a - b).abs().max().item() > 1e-4
    with pytest.raises(ValueError, match="permutation"):
        last_writer_step(sn, configs, x, y, lr=0.1, order=[0, 0, 1])


def test_fork_join_step_updates_shared_weights_and_trains() -> None:
    sn = _supernet()
    x, y = _data(64)
    before = sn.flat.params.clone()
    opt = torch.optim.SGD(sn.model.parameters(), lr=0.5)
    first = fork_join_step(sn, [sn.max(), sn.min()], x, y, opt)
    assert not torch.equal(before, sn.flat.params)
    # The model's own parameters are views of the flat vector.
    assert torch.equal(sn.model[1].weight.reshape(-1), sn.flat.params[: 16 * 12])
    for _ in range(30):
        last = fork_join_step(sn, [sn.max(), sn.min()], x, y, opt)
    assert last[0] < first[0]


def test_samplers() -> None:
    sn = _supernet()
    rng = np.random.default_rng(0)
    assert SandwichSampler(sn.space).draw(rng, 4)[:2] == [sn.max(), sn.min()]
    assert UniformSampler(sn.space).draw(rng, 3)[0] == sn.max()
    assert len(UniformSampler(sn.space, include_max=False).draw(rng, 3)) == 3
    x, y = _data(48)
    ps = PrioritizedSampler(sn, x, y, pool_size=6, refresh_every=2, seed=0)
    p = ps.probabilities()
    assert p.shape == (len(ps.pool),) and abs(p.sum() - 1) < 1e-9
    # Front members (rank 0) are at least as likely as any dominated candidate.
    assert p[ps.ranks == 0].min() >= p.max() - 1e-12
    draws = ps.draw(rng, 5)
    assert draws[0] == sn.max() and all(d in ps.pool for d in draws[1:])
    log = train_supernet(sn, ps, x, y, SupernetTrainConfig(steps=4, batch_size=16, lr=1e-2))
    assert len(log.losses) == 4 and len(ps.history) == 2
    with pytest.raises(ValueError, match="pool_size"):
        PrioritizedSampler(sn, x, y, pool_size=1)


def test_pareto_ranks_and_front() -> None:
    pts = np.array([[1, 5], [2, 2], [3, 1], [3, 3], [4, 4]])
    assert pareto_ranks(pts).tolist() == [0, 0, 0, 1, 2]
    cands = [
        Candidate(SubnetConfig((i,)), acc, cost)
        for i, (acc, cost) in enumerate([(0.9, 10), (0.8, 5), (0.85, 12), (0.5, 1), (0.5, 2)])
    ]
    front = pareto_front(cands)
    assert [c.config.values[0] for c in front] == [3, 1, 0]


def test_exhaustive_and_evolutionary_search_agree_on_small_space() -> None:
    sn = _supernet()

    def acc(c: SubnetConfig) -> float:  # a smooth made-up accuracy, higher with width
        return 1 - 1 / (1 + c.values[0] * c.values[1])

    def cost(c: SubnetConfig) -> float:
        return float(sn.flops(c))

    ex = exhaustive_search(sn.space, acc, cost, budget=cost(sn.max()) * 0.6)
    assert all(c.cost <= cost(sn.max()) * 0.6 for c in ex.evaluated)
    full = exhaustive_search(sn.space, acc, cost)
    assert len(full.evaluated) == 12
    evo = evolutionary_search(sn.space, acc, cost, population=6, generations=6, seed=0)
    assert {c.config for c in full.front} <= {c.config for c in evo.front}
    best = ex.best_under(cost(sn.max()) * 0.6)
    assert best.accuracy == max(c.accuracy for c in ex.evaluated)
    with pytest.raises(ValueError, match="budget"):
        evolutionary_search(sn.space, acc, cost, budget=-1.0)


def test_selective_recall_task() -> None:
    x, y = selective_recall(50, length=10, features=6, classes=4, seed=1)
    assert x.shape == (50, 1, 10, 6) and y.shape == (50,)
    marked = x[:, 0, :, 0].argmax(1)
    tokens = x[torch.arange(50), 0, marked, 1:5].argmax(1)
    assert torch.equal(tokens, y)
    with pytest.raises(ValueError, match="features"):
        selective_recall(5, features=3, classes=4)


def test_join_order_demo_shows_hazard_only_for_last_writer() -> None:
    sn = _supernet()
    x, y = _data()
    out = join_order_demo(sn, [sn.max(), sn.min(), SubnetConfig((12, 4))], x, y, lr=0.1)
    assert out["join_order_max_diff"] <= 1e-12
    assert out["lastwriter_max_diff"] > 1e-4
    assert 0 < out["overlap_fraction"] <= 1
    summary = sn.summary()
    assert summary["width_dims"] == 2 and summary["min_flops"] < summary["max_flops"]


def test_finetune_subnet_distills_keeps_architecture_and_does_not_worsen() -> None:
    # Teacher: the full MLP trained on a learnable rule; the student is its smallest subnet.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(384, 12, generator=g)
    y = (x[:, :3] @ torch.tensor([1.0, -1.0, 0.5])).gt(0).long() + x[:, 3].gt(1).long()
    teacher = _mlp(0)
    opt = torch.optim.Adam(teacher.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(teacher(x[:256]), y[:256]).backward()
        opt.step()
    sn = Supernet(teacher, _supernet().space, _extract, torch.zeros(1, 12), flop_counter=_flops)
    small = sn.extract(sn.min())
    shapes = [tuple(p.shape) for p in small.parameters()]
    flops_before = _flops(small, x[:1])
    xt, yt, xv, yv = x[:256], y[:256], x[256:], y[256:]

    def loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(small(xt), yt))

    val_before, loss_before = _acc(small, xv, yv), loss()
    losses = finetune_subnet(small, teacher, xt, yt, epochs=8, lr=1e-2, x_val=xv, y_val=yv)
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert [tuple(p.shape) for p in small.parameters()] == shapes
    assert _flops(small, x[:1]) == flops_before
    assert _acc(small, xv, yv) >= val_before  # best-epoch selection: never worse on validation
    assert loss() < loss_before  # and it learned something on the training split
    # The teacher is untouched, and epochs=0 is a no-op.
    before = [p.clone() for p in small.parameters()]
    assert finetune_subnet(small, teacher, xt, yt, epochs=0) == []
    assert all(torch.equal(a, b) for a, b in zip(before, small.parameters(), strict=True))
    with pytest.raises(ValueError, match="alpha"):
        finetune_subnet(small, teacher, xt, yt, alpha=1.5)
    with pytest.raises(ValueError, match="x_val"):
        finetune_subnet(small, teacher, xt, yt, x_val=xv)


def _acc(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((module(x).argmax(-1) == y).float().mean())


def test_parameter_coverage_counts_and_leading_slices() -> None:
    sn = _supernet()
    configs = [SubnetConfig((16, 8)), SubnetConfig((8, 4)), SubnetConfig((12, 2))]
    cov = sn.coverage(configs, "3.weight")  # (h2, h1) = (8, 16)
    assert cov.kept == ((8, 16), (4, 8), (2, 12))
    assert cov.leading == (True, True, True)
    assert cov.counts.shape == (8, 16)
    expected = torch.zeros(8, 16, dtype=torch.long)
    for rows, cols in cov.kept:
        expected[:rows, :cols] += 1
    assert torch.equal(cov.counts, expected)
    assert int(cov.counts.max()) == 3 and int(cov.counts.min()) == 1  # three different counts
    assert sn.coverage(configs, "5.bias").kept == ((3,), (3,), (3,))
    with pytest.raises(ValueError, match="not a trainable parameter"):
        sn.coverage(configs, "9.weight")


def test_plot_coverage_outlines_each_subnets_slice() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcnb.supernet.plots import plot_coverage

    sn = _supernet()
    cov = sn.coverage([SubnetConfig((16, 8)), SubnetConfig((8, 4))], "3.weight")
    ax = plot_coverage(cov, ["largest", "small"])
    sizes = sorted((p.get_width(), p.get_height()) for p in ax.patches)
    assert sizes == [pytest.approx((8 - 0.8, 4 - 0.8)), (16, 8)]  # the second one inset
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["largest: 8 rows x 16 columns", "small: 4 rows x 8 columns"]
    with pytest.raises(ValueError, match="labels"):
        plot_coverage(cov, ["one"])
    plt.close("all")
