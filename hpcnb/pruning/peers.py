"""External peer: Torch-Pruning (Fang et al., CVPR 2023, DepGraph) with magnitude importance.

:func:`torch_pruning_at_budget` prunes a copy of the model with
``torch_pruning.pruner.MagnitudePruner`` (per-layer, equal ratio, L2 magnitude over each
dependency group) and finds by bisection the largest pruning ratio whose MACs — counted
by ``torch_pruning.utils.count_ops_and_params`` — stay within the budget. Torch-Pruning
finds residual coupling with its own dependency graph, independently of ``hpcnb.ir``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from hpcnb.errors import InvalidInputError, InvalidStateError

__all__ = ["PeerResult", "torch_pruning_at_budget"]


@dataclass(frozen=True)
class PeerResult:
    """A model pruned by the peer, with the ratio used and its MACs ratio."""

    model: nn.Module
    pruning_ratio: float
    macs_ratio: float


def _classifier_layers(model: nn.Module, num_classes: int | None) -> list[nn.Module]:
    linears: list[nn.Module] = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if num_classes is not None:
        heads = [m for m in linears if m.out_features == num_classes]
        if heads:
            return heads
    return linears[-1:]


def _prune_copy(
    model: nn.Module, example: torch.Tensor, ratio: float, ignored: list[str], norm: int
) -> nn.Module:
    import torch_pruning as tp

    pruned = copy.deepcopy(model).eval()
    modules = dict(pruned.named_modules())
    pruner = tp.pruner.MagnitudePruner(
        pruned,
        example,
        importance=tp.importance.MagnitudeImportance(p=norm),
        pruning_ratio=ratio,
        global_pruning=False,
        ignored_layers=[modules[name] for name in ignored],
    )
    pruner.step()
    return pruned


def torch_pruning_at_budget(
    model: nn.Module,
    example: torch.Tensor,
    target: float,
    *,
    num_classes: int | None = None,
    norm: int = 2,
    tol: float = 2e-3,
) -> PeerResult:
    """Prune a copy of ``model`` with Torch-Pruning to at most ``target`` of its MACs.

    Args:
        model: The trained model (not modified).
        example: An example input batch.
        target: MACs budget as a fraction of the original (0.5 = keep half).
        num_classes: Width of the classifier to leave alone (default: the last Linear).
        norm: Magnitude norm (2 = L2, as GNN-RL's filter selection).
        tol: Bisection tolerance on the pruning ratio.

    Raises:
        InvalidInputError: ``target`` is not in (0, 1].
        InvalidStateError: Even the largest ratio tried misses the budget.
    """
    import torch_pruning as tp

    if not 0 < target <= 1:
        raise InvalidInputError(f"torch_pruning_at_budget: target={target}, expected in (0, 1]")
    names = {m: n for n, m in model.named_modules()}
    ignored = [names[m] for m in _classifier_layers(model, num_classes)]
    base, _ = tp.utils.count_ops_and_params(model, example)

    def macs(ratio: float) -> tuple[float, nn.Module]:
        pruned = _prune_copy(model, example, ratio, ignored, norm)
        ops, _ = tp.utils.count_ops_and_params(pruned, example)
        return ops / base, pruned

    lo, hi = 0.0, 0.8  # MACs ~ (1 - ratio)^2; very high ratios are clamped by the library
    hi_ratio, hi_model = macs(hi)
    if hi_ratio > target:
        raise InvalidStateError(
            f"torch_pruning_at_budget: ratio {hi} keeps {hi_ratio:.3f} > {target}"
        )
    best = (hi, hi_ratio, hi_model)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        ratio, pruned = macs(mid)
        if ratio <= target:
            hi, best = mid, (mid, ratio, pruned)
        else:
            lo = mid
    return PeerResult(model=best[2], pruning_ratio=best[0], macs_ratio=best[1])
