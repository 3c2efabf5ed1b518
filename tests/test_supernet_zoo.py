"""Supernet conversion of zoo models through the IR, and the in-process fork-join join."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.supernet import SandwichSampler, Supernet
from hpcnb.supernet.forkjoin import coverage_average, local_gradients

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
