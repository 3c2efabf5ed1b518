"""Supernet conversion of zoo models through the IR, and the MPI fork-join run."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.supernet import SandwichSampler, Supernet
from hpcnb.supernet.forkjoin import coverage_average, fork_join_step, local_gradients
from hpcnb.supernet.mpi import ForkJoinJob, run_forkjoin_mpi, run_local, write_job

ZOO_NAMES = ("resnet", "vit", "mlp_mixer", "mamba", "mlp")


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_converts_and_min_subnet_runs(name: str) -> None:
    spec = models.ZOO[name]
    torch.manual_seed(0)
    model = spec.build("tiny")
    x = spec.example_input("tiny", batch=4)
    ref = model(x)
    sn = Supernet.from_model(copy.deepcopy(model), x[:1])
    assert len(sn.space) > 0
    # Keeping everything reproduces the original (reordering does not change the function).
    assert torch.allclose(sn.extract(sn.max())(x), ref, atol=1e-5)
    small = sn.extract(sn.min())
    assert small(x).shape == ref.shape
    assert sn.flops(sn.min()) < sn.flops(sn.max())
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())


def test_vit_space_has_widths_heads_and_depth() -> None:
    model = models.vit(dim=32, depth=2, heads=4, mlp_dim=64)
    sn = Supernet.from_model(model, torch.zeros(1, 1, 8, 8))
    kinds = {d.kind for d in sn.space.dims}
    assert kinds == {"width", "heads", "depth"}


def test_zoo_join_matches_sequential_accumulation_and_order() -> None:
    torch.manual_seed(0)
    model = models.vit(dim=16, depth=2, heads=2, mlp_dim=32)
    sn = Supernet.from_model(model, torch.zeros(1, 1, 8, 8))
    x, y = torch.randn(16, 1, 8, 8), torch.randint(10, (16,))
    rng = np.random.default_rng(0)
    configs = SandwichSampler(sn.space).draw(rng, 4)
    together = local_gradients(sn, configs, x, y, distill=True)
    # Sequential accumulation: one worker per subnet (each recomputes the teacher),
    # results added up one after another in reverse order.
    sums = torch.zeros_like(together.sums)
    counts = torch.zeros_like(together.counts)
    for c in reversed(configs):
        part = local_gradients(sn, [c], x, y, distill=True)
        sums += part.sums
        counts += part.counts
    diff = (coverage_average(sums, counts) - coverage_average(together.sums, together.counts)).abs()
    assert diff.max().item() <= 1e-6


@pytest.mark.mpi
def test_mpi_two_ranks_match_sequential(tmp_path: Path) -> None:
    kwargs = {"dim": 16, "depth": 2, "heads": 2, "mlp_dim": 32}
    torch.manual_seed(0)
    model = models.vit(**kwargs)
    sn = Supernet.from_model(model, torch.zeros(1, 1, 8, 8))
    rng = np.random.default_rng(0)
    schedule = tuple(
        tuple(tuple(c.values) for c in SandwichSampler(sn.space).draw(rng, 4)) for _ in range(3)
    )
    job = ForkJoinJob(
        factory="hpcnb.models:vit",
        factory_kwargs=kwargs,
        example_shape=(1, 1, 8, 8),
        schedule=schedule,
        batch_size=16,
        lr=0.05,
        optimizer="sgd",
        seed=0,
    )
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8, generator=gen), torch.randint(10, (64,), generator=gen)
    folder = write_job(tmp_path / "job", job, sn.model.state_dict(), x.numpy(), y.numpy())
    seq = run_local(folder, threads=1, timeout=120)
    par = run_forkjoin_mpi(folder, 2, timeout=120)
    assert par["ranks"] == 2 and seq["ranks"] == 1
    assert (seq["final"] - par["final"]).abs().max().item() <= 1e-5
    assert not torch.equal(seq["final"], sn.flat.params)  # it trained
    # The in-process fork-join step gives the same weights as the sequential subprocess.
    opt = torch.optim.SGD(sn.model.parameters(), lr=0.05, momentum=0.9)
    from hpcnb.supernet.space import SubnetConfig
    from hpcnb.supernet.training import batches

    idx = list(batches(64, 16, np.random.default_rng(0), 3))
    for step, ix in zip(schedule, idx, strict=True):
        fork_join_step(sn, [SubnetConfig(c) for c in step], x[ix], y[ix], opt)
    assert (sn.flat.params - seq["final"]).abs().max().item() <= 1e-5
