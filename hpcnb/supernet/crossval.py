"""Cross-validated accuracy of a subnet: the whole OSF pipeline once per fold.

A subnet's accuracy drop against its full model, measured on a few hundred test items,
has an interval several points wide. Cross-validation makes every item of a data set a
test item once: for each fold, :func:`form_and_search` pretrains the base model on the
fold's training items, converts it into a supernet, trains the supernet with the
sandwich rule and searches it on the fold's validation items; :func:`finetune_and_score`
picks the most accurate subnet within the FLOPs budget, fine-tunes it (one or more
seeds) and scores the full model and the subnet item by item on the fold's test items.
:class:`CrossValidation` pools the per-item scores of all folds into one mean drop with
a fold-and-item paired bootstrap interval
(:func:`hpcnb.models.metrics.pooled_gap_interval`).

Example:
    >>> import numpy as np, torch
    >>> from hpcnb.data import kfold_splits
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(60, 1, 2, 3)).astype(np.float32)
    >>> y = (x.reshape(60, -1).sum(1) > 0).astype(np.int64)
    >>> def build() -> torch.nn.Module:
    ...     return torch.nn.Sequential(
    ...         torch.nn.Flatten(), torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    ...     )
    >>> config = SubnetPipelineConfig(
    ...     pretrain_epochs=1, train=SupernetTrainConfig(steps=2, batch_size=16),
    ...     finetune_epochs=1, population=4, generations=1,
    ... )
    >>> cv = cross_validate_subnet(build, kfold_splits(x, y, k=3), config)
    >>> cv.n_items, [len(f.full_correct) for f in cv.folds]
    (60, [20, 20, 20])
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from tqdm import TqdmWarning

with warnings.catch_warnings():  # without ipywidgets tqdm.auto falls back to text bars
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from hpcnb.errors import InvalidInputError
from hpcnb.models.metrics import pooled_gap_interval, top1_correct
from hpcnb.progress import show_progress

from .samplers import SandwichSampler
from .search import Candidate, SubnetSearchResult, search_supernet
from .supernet import Supernet
from .training import SupernetTrainConfig, finetune_subnet, train_model, train_supernet

if TYPE_CHECKING:  # pragma: no cover
    from hpcnb.data.embedded import ImageSplit
    from hpcnb.stats import Estimate

__all__ = [
    "CrossValidation",
    "FoldResult",
    "FormedSupernet",
    "SubnetPipelineConfig",
    "cross_validate_subnet",
    "finetune_and_score",
    "form_and_search",
]

_SPLIT_FIELDS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


@dataclass(frozen=True)
class SubnetPipelineConfig:
    """Settings of the pipeline from a base model to a fine-tuned subnet, per fold.

    Attributes:
        pretrain_epochs: Epochs of base-model pretraining (Adam, cosine-annealed).
        pretrain_items: Pretrain on the first this many training items only (``None``:
            all of them).
        train: Sandwich-rule supernet training.
        flops_budget: The chosen subnet is the most accurate front member with at most
            this fraction of the full model's FLOPs.
        population: Evolutionary search population.
        generations: Evolutionary search generations.
        calib_items: Training items for batch-norm recalibration during the search.
        finetune_epochs: Epochs of subnet fine-tuning with distillation (0: none).
        finetune_lr: Peak learning rate of fine-tuning.
        finetune_seeds: Seeds of the fine-tuning runs of the chosen subnet (a subnet's
            per-item score is the mean over them).
        seed: Seed of the base model's initial weights, pretraining and the search.
    """

    pretrain_epochs: int = 20
    pretrain_items: int | None = None
    train: SupernetTrainConfig = field(default_factory=SupernetTrainConfig)
    flops_budget: float = 0.5
    population: int = 16
    generations: int = 8
    calib_items: int = 512
    finetune_epochs: int = 5
    finetune_lr: float = 5e-4
    finetune_seeds: tuple[int, ...] = (0,)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pretrain_epochs < 0 or self.finetune_epochs < 0 or self.calib_items < 1:
            raise InvalidInputError(
                f"SubnetPipelineConfig: pretrain_epochs={self.pretrain_epochs} (>= 0), "
                f"finetune_epochs={self.finetune_epochs} (>= 0), calib_items={self.calib_items} "
                "(>= 1)"
            )
        if not 0 < self.flops_budget <= 1 or not self.finetune_seeds:
            raise InvalidInputError(
                f"SubnetPipelineConfig: flops_budget={self.flops_budget} must lie in (0, 1] and "
                f"finetune_seeds={self.finetune_seeds} name at least one seed"
            )


@dataclass
class FormedSupernet:
    """One fold's stages before fine-tuning.

    Attributes:
        pretrained: The base model pretrained on the fold's training items (eval mode).
        supernet: Its supernet after sandwich-rule training.
        search: The (validation accuracy, FLOPs) search on the fold's validation items.
    """

    pretrained: nn.Module
    supernet: Supernet
    search: SubnetSearchResult


@dataclass
class FoldResult:
    """One fold: the chosen subnet and the per-item scores on the fold's test items.

    Attributes:
        fold: Index of the fold.
        formed: The fold's pretrained model, supernet and search.
        chosen: The subnet chosen within the FLOPs budget (its cost: FLOPs).
        full_flops: FLOPs of the full model.
        subnets: Per fine-tuning seed, the fine-tuned subnet.
        full_correct: Per test item, 1 where the full model is right, else 0.
        untuned_correct: The same for the subnet straight from the supernet.
        tuned_correct: Per fine-tuning seed (rows) and test item (columns), the same for
            the fine-tuned subnet.
        seconds: Wall time of the fold's fine-tuning and scoring (plus the stages before,
            when this call ran them).
    """

    fold: int
    formed: FormedSupernet
    chosen: Candidate
    full_flops: float
    subnets: dict[int, nn.Module]
    full_correct: np.ndarray
    untuned_correct: np.ndarray
    tuned_correct: np.ndarray
    seconds: float = 0.0

    @property
    def subnet_items(self) -> np.ndarray:
        """Per test item, the fine-tuned subnet's score averaged over the seeds."""
        return self.tuned_correct.mean(axis=0)


def _tensors(split: Any) -> dict[str, torch.Tensor]:
    """The six arrays of a split as tensors (a split of tensors is left as it is)."""
    missing = [k for k in _SPLIT_FIELDS if not hasattr(split, k)]
    if missing:
        raise InvalidInputError(f"{type(split).__name__}: a split needs {missing}")
    return {k: torch.as_tensor(getattr(split, k)) for k in _SPLIT_FIELDS}


def form_and_search(
    build: Callable[[], nn.Module],
    split: ImageSplit,
    config: SubnetPipelineConfig,
    *,
    progress: bool | None = None,
) -> FormedSupernet:
    """Pretrain a fresh model on a split, convert it into a supernet, train and search it.

    The steps and their arguments are those of notebook 01's build, convert and run
    sections: the base model is built after ``torch.manual_seed(config.seed)``,
    pretrained on the training items, converted by :meth:`Supernet.from_model`, trained
    with :func:`~hpcnb.supernet.training.train_supernet` and a
    :class:`~hpcnb.supernet.samplers.SandwichSampler`, and searched on the validation
    items (batch norms recalibrated on the first ``calib_items`` training items).

    Args:
        build: Builds the untrained base model.
        split: Training, validation and test items (the test items are not used here).
        config: The pipeline's settings.
        progress: Show tqdm bars (``None``: :func:`~hpcnb.progress.show_progress` decides).

    Returns:
        The pretrained model, the trained supernet and the search result.
    """
    t = _tensors(split)
    torch.manual_seed(config.seed)
    model = build()
    n = config.pretrain_items
    train_model(
        model,
        t["x_train"][:n],
        t["y_train"][:n],
        epochs=config.pretrain_epochs,
        seed=config.seed,
        progress=progress,
    )
    supernet = Supernet.from_model(copy.deepcopy(model), t["x_train"][:1])
    sampler = SandwichSampler(supernet.space)
    train_supernet(supernet, sampler, t["x_train"], t["y_train"], config.train, progress=progress)
    search = search_supernet(
        supernet,
        t["x_val"],
        t["y_val"],
        calib_x=t["x_train"][: config.calib_items],
        population=config.population,
        generations=config.generations,
        seed=config.seed,
    )
    return FormedSupernet(model, supernet, search)


def finetune_and_score(
    formed: FormedSupernet,
    split: ImageSplit,
    config: SubnetPipelineConfig,
    *,
    fold: int = 0,
    progress: bool | None = None,
) -> FoldResult:
    """Choose the subnet within the budget, fine-tune it and score both models per item.

    The chosen subnet is extracted as a dense module and fine-tuned once per seed of
    ``config.finetune_seeds`` with distillation from the pretrained model on the
    training items (the validation items pick the best epoch); the test items are used
    only for the final scores.

    Args:
        formed: The fold's pretrained model, supernet and search (:func:`form_and_search`).
        split: The same fold's items.
        config: The pipeline's settings.
        fold: Index of the fold (kept in the result).
        progress: Show tqdm bars (``None``: :func:`~hpcnb.progress.show_progress` decides).

    Returns:
        The fold's chosen subnet, fine-tuned subnets and per-item scores.

    Raises:
        InvalidInputError: No front member fits the FLOPs budget.
    """
    t0 = time.perf_counter()
    t = _tensors(split)
    sn = formed.supernet
    full_flops = float(sn.flops(sn.max()))
    chosen = formed.search.best_under(config.flops_budget * full_flops)
    untuned = sn.extract(chosen.config)
    subnets: dict[int, nn.Module] = {}
    for s in config.finetune_seeds:
        subnets[s] = copy.deepcopy(untuned)
        finetune_subnet(
            subnets[s],
            formed.pretrained,
            t["x_train"],
            t["y_train"],
            epochs=config.finetune_epochs,
            lr=config.finetune_lr,
            x_val=t["x_val"],
            y_val=t["y_val"],
            seed=s,
            progress=progress,
        )
    x, y = t["x_test"], t["y_test"]
    return FoldResult(
        fold=fold,
        formed=formed,
        chosen=chosen,
        full_flops=full_flops,
        subnets=subnets,
        full_correct=top1_correct(formed.pretrained, x, y),
        untuned_correct=top1_correct(untuned, x, y),
        tuned_correct=np.stack([top1_correct(m, x, y) for m in subnets.values()]),
        seconds=time.perf_counter() - t0,
    )


@dataclass(frozen=True)
class CrossValidation:
    """The per-fold results of a cross-validated subnet, pooled over all test items.

    Attributes:
        folds: One result per fold, in fold order.
    """

    folds: tuple[FoldResult, ...]

    @property
    def n_items(self) -> int:
        """Test items over all folds (every item of the data set once)."""
        return sum(len(f.full_correct) for f in self.folds)

    def drop(self, *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Estimate:
        """Accuracy of the full model minus the fine-tuned subnet's, over all test items.

        Args:
            confidence: Coverage of the interval.
            resamples: Bootstrap resamples (folds, and items inside each drawn fold).
            seed: Seed of the resampling.
        """
        return self._gap([f.subnet_items for f in self.folds], confidence, resamples, seed)

    def drop_before_finetune(
        self, *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
    ) -> Estimate:
        """The same as :meth:`drop` for the subnets straight from the supernets.

        Args:
            confidence: Coverage of the interval.
            resamples: Bootstrap resamples (folds, and items inside each drawn fold).
            seed: Seed of the resampling.
        """
        return self._gap([f.untuned_correct for f in self.folds], confidence, resamples, seed)

    def _gap(
        self, subnet: list[np.ndarray], confidence: float, resamples: int, seed: int
    ) -> Estimate:
        """Full model minus ``subnet`` (per fold, per test item), pooled and paired."""
        return pooled_gap_interval(
            [f.full_correct for f in self.folds],
            subnet,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )

    def table(self) -> list[dict[str, float]]:
        """Rows per fold: test items, accuracies, the chosen subnet's FLOPs share, seconds."""
        return [
            {
                "fold": f.fold,
                "test items": len(f.full_correct),
                "full accuracy": float(f.full_correct.mean()),
                "subnet accuracy before fine-tuning": float(f.untuned_correct.mean()),
                "subnet accuracy": float(f.subnet_items.mean()),
                "subnet FLOPs / full": f.chosen.cost / f.full_flops,
                "seconds": f.seconds,
            }
            for f in self.folds
        ]


def cross_validate_subnet(
    build: Callable[[], nn.Module],
    splits: Sequence[ImageSplit],
    config: SubnetPipelineConfig,
    *,
    first: FormedSupernet | None = None,
    progress: bool | None = None,
) -> CrossValidation:
    """Run the pipeline on every fold and pool the per-item scores.

    Args:
        build: Builds the untrained base model (the same for every fold).
        splits: One split per fold, each testing on its own items
            (:func:`hpcnb.data.digits_folds`, :func:`hpcnb.data.kfold_splits`).
        config: The pipeline's settings, the same for every fold.
        first: Fold 0's stages before fine-tuning when they were already run with the
            same settings (:func:`form_and_search` is then skipped for fold 0).
        progress: Show a bar over the folds and the stages' bars (``None``:
            :func:`~hpcnb.progress.show_progress` decides).

    Returns:
        The per-fold results.

    Raises:
        InvalidInputError: No splits, or a fold whose front has no subnet within budget.
    """
    if not splits:
        raise InvalidInputError("cross_validate_subnet: give at least one split")
    results = []
    bar = tqdm(list(enumerate(splits)), disable=not show_progress(progress), desc="folds")
    for f, split in bar:
        t0 = time.perf_counter()
        formed = first if f == 0 and first is not None else None
        if formed is None:
            formed = form_and_search(build, split, config, progress=progress)
        result = finetune_and_score(formed, split, config, fold=f, progress=progress)
        result.seconds = time.perf_counter() - t0
        results.append(result)
    return CrossValidation(tuple(results))
