"""OSF: weight-sharing supernets from pretrained models, samplers, fork-join training, search.

Reproduces "OSF: Optimized Supernet Formation" (Sixing Yu et al.): a model is converted
into a supernet through the IR's channel groups and residual blocks
(:meth:`Supernet.from_model`), subnets are real smaller modules extracted by graph
traversal, training uses the sandwich rule with in-place distillation and uniform,
sandwich or prioritised samplers, several subnets train concurrently on shared weights
with a fork-join step whose join is a coverage-count average (MPI ``Allreduce``), and
evolutionary or exhaustive search returns Pareto fronts.

This face exports the core model only. The fork-join step and its join-order
experiments live in :mod:`~hpcnb.supernet.forkjoin`, the MPI jobs and their benchmark in
:mod:`~hpcnb.supernet.mpi`, the full-model-against-subnet measurement in
:mod:`~hpcnb.supernet.benchmark`, Pareto ranking in :mod:`~hpcnb.supernet.pareto`, and
pretraining and the synthetic sequence task in :mod:`~hpcnb.supernet.training`.

Example:
    >>> import numpy as np, torch
    >>> from hpcnb.supernet import SandwichSampler, Supernet
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Sequential(
    ...     torch.nn.Flatten(), torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ... )
    >>> sn = Supernet.from_model(model, torch.zeros(1, 12))
    >>> largest, smallest = SandwichSampler(sn.space).draw(np.random.default_rng(0), 2)
    >>> sn.extract(smallest)(torch.zeros(2, 12)).shape, sn.flops(smallest) < sn.flops(largest)
    (torch.Size([2, 3]), True)
"""

from hpcnb.supernet.samplers import PrioritizedSampler, Sampler, SandwichSampler, UniformSampler
from hpcnb.supernet.search import (
    Candidate,
    SubnetSearchResult,
    evolutionary_search,
    exhaustive_search,
    search_supernet,
)
from hpcnb.supernet.space import Dimension, SearchSpace, SubnetConfig
from hpcnb.supernet.supernet import Supernet
from hpcnb.supernet.training import (
    SupernetTrainConfig,
    TrainLog,
    finetune_subnet,
    subnet_accuracy,
    train_supernet,
)

__all__ = [
    # The supernet: a pretrained model with elastic widths and depths, and its space
    "Supernet",
    "SearchSpace",
    "Dimension",
    "SubnetConfig",
    # Which subnets each training step trains
    "Sampler",
    "UniformSampler",
    "SandwichSampler",
    "PrioritizedSampler",
    # Sandwich-rule training with in-place distillation; scoring and fine-tuning a subnet
    "SupernetTrainConfig",
    "TrainLog",
    "train_supernet",
    "subnet_accuracy",
    "finetune_subnet",
    # Search for the accuracy / cost Pareto front
    "Candidate",
    "SubnetSearchResult",
    "search_supernet",
    "evolutionary_search",
    "exhaustive_search",
]
