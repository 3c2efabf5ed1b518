"""Tests of the bitwise-reproducible fork-join: a fixed-order reduction, hashed (issue 20).

The joined gradients must be bitwise identical for 1, 2 and 4 ranks and any arrival
order: the test compares SHA-256 digests of the joined vectors, not a tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpcnb import models
from hpcnb.supernet import SandwichSampler, Supernet
from hpcnb.supernet.forkjoin import (
    assign_subnets,
    bitwise_join_check,
    canonical_join,
    coverage_average,
    fork_join_step,
    join_digest,
    subnet_gradients,
)

torch.set_num_threads(1)


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    kwargs = {"dim": 16, "depth": 2, "heads": 2, "mlp_dim": 32}
    sn = Supernet.from_model(models.vit(**kwargs), torch.zeros(1, 1, 8, 8))
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 1, 8, 8, generator=gen), torch.randint(10, (32,), generator=gen)
    configs = SandwichSampler(sn.space).draw(np.random.default_rng(seed), 4)
    return sn, kwargs, x, y, configs


def test_join_is_bitwise_identical_for_1_2_4_ranks_and_any_arrival_order() -> None:
    sn, _, x, y, configs = _setup()
    digests = set()
    rng = np.random.default_rng(1)
    for ranks in (1, 2, 4):
        shares = assign_subnets(sn, configs, ranks)
        per_rank = [subnet_gradients(sn, configs, share, x, y) for share in shares]
        for _ in range(4):
            gathered: dict = {}
            for r in rng.permutation(ranks):
                gathered.update(per_rank[int(r)])
            assert sorted(gathered) == list(range(len(configs)))
            digests.add(join_digest(*canonical_join(gathered)))
    assert len(digests) == 1
    check = bitwise_join_check(sn, configs, x, y, ranks=(1, 2, 4), orders=3)
    assert check["identical"] and len(check["digests"]) == 9
    assert set(check["digests"].values()) == digests


def test_a_changed_gradient_changes_the_digest() -> None:
    sn, _, x, y, configs = _setup()
    parts = subnet_gradients(sn, configs, range(len(configs)), x, y)
    sums, counts = canonical_join(parts)
    nudged = sums.clone()
    i = int(torch.nonzero(sums)[0])
    nudged[i] = torch.nextafter(sums[i], torch.tensor(np.inf, dtype=sums.dtype))  # one ulp
    assert join_digest(nudged, counts) != join_digest(sums, counts)
    with pytest.raises(ValueError):
        canonical_join({})


def test_fork_join_step_applies_the_canonical_join() -> None:
    sn, _, x, y, configs = _setup()
    expected = coverage_average(*canonical_join(subnet_gradients(sn, configs, range(4), x, y)))
    opt = torch.optim.SGD(sn.model.parameters(), lr=0.0)
    fork_join_step(sn, configs, x, y, opt)
    assert torch.equal(sn.flat.grads.double(), expected.to(sn.flat.grads.dtype).double())
    with pytest.raises(ValueError, match="join"):
        fork_join_step(sn, configs, x, y, opt, join="fastest")


@pytest.mark.mpi
def test_mpi_ranks_train_bitwise_the_same_weights_as_one_process(tmp_path: Path) -> None:
    from test_supernet_timing import _sandwich_job

    from hpcnb.supernet.mpi import run_forkjoin_mpi, run_local, write_job

    sn, kwargs, x, y, _ = _setup()
    _, job = _sandwich_job(sn, kwargs)  # three sandwich steps of four subnets, SGD, 1 thread
    folder = write_job(tmp_path / "job", job, sn.model.state_dict(), x.numpy(), y.numpy())
    seq = run_local(folder, threads=1, timeout=120)
    par = run_forkjoin_mpi(folder, 2, timeout=120)
    assert par["ranks"] == 2
    assert torch.equal(seq["final"], par["final"])
