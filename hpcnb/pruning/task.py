"""A real network as a :class:`~hpcnb.pruning.problem.PruningProblem`, through ``hpcnb.ir``.

:class:`ModelPruningTask` traces the model with :func:`hpcnb.ir.trace`; its prunable units
are the IR's prunable channel groups (channels tied by residual sums, depthwise
convolutions or norms are one unit, found by graph traversal). It derives

* the bilinear :class:`~hpcnb.pruning.problem.FlopsModel` from the IR nodes' FLOPs and the
  groups' parameter slices (exact for convolutions and linear layers),
* the channel order of every group by filter norm (L2 as in the paper, or L1),
* the accuracy oracle: the model evaluated with the pruned channels' parameter slices set
  to zero (``torch.func.functional_call`` on a private copy of the model) — the same
  function as the extracted, physically smaller network, which
  :meth:`ModelPruningTask.extract` builds with :func:`hpcnb.ir.extract`. Given
  calibration inputs, the oracle first re-estimates every BatchNorm layer's statistics
  for the pruned network (reset, cumulative average over the calibration batches, as
  :func:`~hpcnb.pruning.training.recalibrate_batchnorm` does for an extracted network),
  so the reward sees the network as every method's evaluation does, not one with stale
  statistics,
* the :class:`~hpcnb.pruning.hiergraph.HierarchicalGraph` observation.
"""

from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from hpcnb import ir
from hpcnb.errors import InvalidInputError
from hpcnb.pruning.hiergraph import (
    KIND_VOCAB,
    HierarchicalGraph,
    kind_one_hot,
    level1_channel_graph,
)
from hpcnb.pruning.problem import FlopsModel, keep_counts

__all__ = ["ModelPruningTask"]

_WEIGHTED = ("conv", "linear", "norm")


class ModelPruningTask:
    """Pruning problem of a trained classifier on a held-out split.

    Args:
        model: The trained classifier (kept in eval mode, never modified).
        example_input: An input batch (its first sample is traced).
        x_val: Held-out inputs for the reward (a split of the *training* data).
        y_val: Held-out labels.
        features: ``"weights"`` (weight statistics) or ``"random"`` (the paper's code).
        criterion: Filter ranking, ``"l2"`` (paper) or ``"l1"``.
        bins: ``K``, channel bins per side of each level-1 graph.
        seed: Seed of the random node features.
        x_calib: Inputs whose batches re-estimate the BatchNorm statistics of every
            pruned network before its accuracy is taken (training inputs, never the
            held-out or test ones); ``None`` keeps the statistics inherited from the
            original network.
        calibration_batch: Items per calibration batch.

    Attributes:
        ir_graph: The traced :class:`hpcnb.ir.Graph`.
        groups: The prunable :class:`hpcnb.ir.ChannelGroup` list.
        group_ids: Their ids.
        group_sizes: ``(G,)`` their sizes.
        order: Per group, element indices from most to least important.
        flops_model: FLOPs as a function of keep fractions.
        graph: The hierarchical graph observation.
    """

    def __init__(
        self,
        model: nn.Module,
        example_input: torch.Tensor,
        x_val: np.ndarray | torch.Tensor,
        y_val: np.ndarray | torch.Tensor,
        *,
        features: Literal["weights", "random"] = "weights",
        criterion: Literal["l2", "l1"] = "l2",
        bins: int = 4,
        seed: int = 0,
        x_calib: np.ndarray | torch.Tensor | None = None,
        calibration_batch: int = 64,
    ) -> None:
        if features not in ("weights", "random"):
            raise InvalidInputError(
                f"ModelPruningTask: features={features!r}, expected 'weights' or 'random'"
            )
        if criterion not in ("l2", "l1"):
            raise InvalidInputError(
                f"ModelPruningTask: criterion={criterion!r}, expected 'l2' or 'l1'"
            )
        if bins < 1:
            raise InvalidInputError(f"ModelPruningTask: bins={bins}, expected >= 1")
        if calibration_batch < 1:
            raise InvalidInputError(
                f"ModelPruningTask: calibration_batch={calibration_batch}, expected >= 1"
            )
        self.model = model.eval()
        self.example_input = example_input[:1]
        self.x_val = torch.as_tensor(np.asarray(x_val)).float()
        self.y_val = torch.as_tensor(np.asarray(y_val)).long()
        self.ir_graph = ir.trace(self.model, self.example_input)
        self._state = {k: v.detach() for k, v in self.model.state_dict().items()}
        self._calibration = self._calibration_setup(x_calib, calibration_batch)
        # A pruning unit needs a producer: some weight whose output axis it slices.
        self.groups = [
            g
            for g in self.ir_graph.groups()
            if g.prunable and any(m.axis == 0 and m.param.endswith("weight") for m in g.members)
        ]
        if not self.groups:
            raise InvalidInputError(
                f"ModelPruningTask: {type(model).__name__} has no prunable channel group"
            )
        self.group_ids = [g.id for g in self.groups]
        self.group_sizes = np.array([g.size for g in self.groups], dtype=np.int64)
        self._index = {g.id: i for i, g in enumerate(self.groups)}
        self._param_names = {name for name, _ in self.model.named_parameters()}
        self.order = [self._rank(g, criterion) for g in self.groups]
        self._node_group = self._node_groups()
        self.flops_model = self._flops_model()
        self.graph = self._hierarchical_graph(features, bins, seed)

    # -- channel ranking and masking ------------------------------------------------------
    def _rank(self, group: ir.ChannelGroup, criterion: str) -> np.ndarray:
        """Element order of ``group`` by the norm of its producing filters, largest first."""
        producers = [
            m
            for m in group.members
            if m.axis == 0 and m.param in self._state and self._state[m.param].dim() >= 2
        ]
        slices = producers or [m for m in group.members if m.param in self._state]
        score = torch.zeros(group.size, dtype=torch.float64)
        for m in slices:
            t = self._state[m.param].narrow(m.axis, m.offset, m.length * m.unit).movedim(m.axis, 0)
            t = t.reshape(group.size, -1).double()
            score += t.pow(2).sum(1) if criterion == "l2" else t.abs().sum(1)
        return np.argsort(-score.numpy(), kind="stable")

    def keep_indices(self, counts: np.ndarray) -> dict[str, list[int]]:
        """Return ``{group id: sorted kept element indices}`` for per-group counts."""
        counts = self._check_counts(counts)
        return {
            gid: sorted(int(i) for i in self.order[j][: counts[j]])
            for j, gid in enumerate(self.group_ids)
        }

    def _check_counts(self, counts: np.ndarray) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.int64)
        if (
            counts.shape != self.group_sizes.shape
            or (counts < 1).any()
            or (counts > self.group_sizes).any()
        ):
            raise InvalidInputError(
                f"counts {counts.tolist()}: expected {len(self.group_sizes)} integers in "
                f"[1, size] with sizes {self.group_sizes.tolist()}"
            )
        return counts

    def masked_parameters(self, counts: np.ndarray) -> dict[str, torch.Tensor]:
        """Return the parameters with every pruned channel's slices set to zero."""
        counts = self._check_counts(counts)
        out: dict[str, torch.Tensor] = {}
        for j, group in enumerate(self.groups):
            dropped = self.order[j][counts[j] :]
            if len(dropped) == 0:
                continue
            for m in group.members:
                if m.param not in self._param_names:
                    continue
                tensor = out.get(m.param)
                if tensor is None:
                    tensor = out[m.param] = self._state[m.param].clone()
                idx = torch.as_tensor(m.indices([int(i) for i in dropped]))
                tensor.index_fill_(m.axis, idx, 0.0)
        return out

    def _calibration_setup(
        self, x_calib: np.ndarray | torch.Tensor | None, batch: int
    ) -> tuple[nn.Module, list[torch.Tensor], list[str]] | None:
        """A private copy of the model, the calibration batches and the BatchNorm names."""
        if x_calib is None:
            return None
        xc = torch.as_tensor(np.asarray(x_calib)).float()
        if xc.shape[0] == 0 or xc.shape[1:] != self.x_val.shape[1:]:
            raise InvalidInputError(
                f"ModelPruningTask: x_calib of shape {tuple(xc.shape)}, expected a non-empty "
                f"batch of inputs shaped like x_val {tuple(self.x_val.shape[1:])}"
            )
        scratch = copy.deepcopy(self.model).eval()
        norms = []
        for name, m in scratch.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                m.momentum = None  # cumulative average
                norms.append(name)
        return scratch, list(torch.split(xc, batch)), norms

    def calibrated_state(self, counts: np.ndarray) -> dict[str, torch.Tensor]:
        """Parameters and BatchNorm statistics of the pruned network, after recalibration.

        Without calibration inputs the statistics are the original network's.

        Args:
            counts: ``(G,)`` kept channels per group.
        """
        state = {**self._state, **self.masked_parameters(counts)}
        if self._calibration is None:
            return state
        scratch, batches, norms = self._calibration
        for name in norms:
            mean = state[f"{name}.running_mean"]
            state[f"{name}.running_mean"] = torch.zeros_like(mean)
            state[f"{name}.running_var"] = torch.ones_like(mean)
            state[f"{name}.num_batches_tracked"] = torch.zeros((), dtype=torch.long)
        try:
            for name in norms:
                scratch.get_submodule(name).train()
            with torch.no_grad():
                for xb in batches:  # updates the fresh statistics in place
                    functional_call(scratch, state, (xb,), strict=False)
        finally:
            scratch.eval()
        return state

    def accuracy(self, counts: np.ndarray) -> float:
        """Held-out accuracy of the model pruned to ``counts`` channels (no fine-tuning).

        With calibration inputs the pruned network's BatchNorm statistics are
        re-estimated first (:meth:`calibrated_state`).

        Args:
            counts: ``(G,)`` kept channels per group.
        """
        return float(self.correct(counts).mean())

    @torch.no_grad()
    def correct(self, counts: np.ndarray) -> np.ndarray:
        """Per held-out item, whether the pruned model (see :meth:`accuracy`) is right.

        Args:
            counts: ``(G,)`` kept channels per group.
        """
        if self._calibration is None:
            state: dict[str, torch.Tensor] = self.masked_parameters(counts)
            net = self.model
        else:
            state, net = self.calibrated_state(counts), self._calibration[0]
        logits = functional_call(net, state, (self.x_val,), strict=False)
        return (logits.argmax(1) == self.y_val).numpy()

    def extract(self, keep: np.ndarray, *, ratios: bool = True) -> nn.Module:
        """Return the physically smaller network (``hpcnb.ir.extract``).

        Args:
            keep: ``(G,)`` keep ratios (``ratios=True``) or kept counts.
            ratios: Whether ``keep`` holds ratios rather than counts.
        """
        counts = keep_counts(keep, self.group_sizes) if ratios else np.asarray(keep)
        return ir.extract(self.model, self.ir_graph, keep=self.keep_indices(counts))

    # -- FLOPs model ------------------------------------------------------------------------
    def _slices(self, param: str, axis: int) -> list[tuple[int, int]]:
        """``[(group index, tensor indices covered)]`` of the prunable groups on one axis."""
        out = []
        for j, group in enumerate(self.groups):
            for m in group.members:
                if m.param == param and m.axis == axis:
                    out.append((j, m.length * m.unit))
        return out

    def layer_groups(self, param: str) -> tuple[int, int]:
        """``(output group, input group)`` indices of a weight, ``-1`` where none sets it.

        A group counts only when it spans the whole axis (as in the zoo's networks); a
        weight whose axis is split between several groups reports ``-1`` there.

        Args:
            param: A weight's parameter name, e.g. ``"stem.0.weight"``.
        """
        if param not in self._state:
            raise InvalidInputError(f"layer_groups: {param!r} is not a parameter of the model")
        shape = self._state[param].shape
        found = []
        for axis in (0, 1):
            parts = self._slices(param, axis) if len(shape) > axis else []
            full = len(parts) == 1 and parts[0][1] == shape[axis]
            found.append(parts[0][0] if full else -1)
        return found[0], found[1]

    def _node_groups(self) -> np.ndarray:
        """Group that sets each IR node's channel count (-1: none or not prunable)."""
        by_name: dict[str, int] = {}
        channels: dict[str, int] = {}
        for node in self.ir_graph.nodes:
            channels[node.name] = node.out_shape[1] if len(node.out_shape) >= 2 else -1
            group = -1
            if node.kind in _WEIGHTED and f"{node.module}.weight" in self._state:
                slices = self._slices(f"{node.module}.weight", 0)
                group = slices[0][0] if slices else -1
            else:
                for name in node.inputs:
                    if (
                        name in by_name
                        and by_name[name] >= 0
                        and channels.get(name) == channels[node.name]
                    ):
                        group = by_name[name]
                        break
            by_name[node.name] = group
        return np.array([by_name[n.name] for n in self.ir_graph.nodes], dtype=np.int64)

    def flops_model_of(self, kinds: tuple[str, ...]) -> FlopsModel:
        """Return the FLOPs model restricted to IR nodes of the given kinds.

        ``flops_model_of(("conv", "linear"))`` counts what
        ``torch.utils.flop_counter.FlopCounterMode`` counts for these networks.

        Args:
            kinds: IR op kinds to include.
        """
        return self._flops_model(kinds)

    def _flops_model(self, kinds: tuple[str, ...] | None = None) -> FlopsModel:
        constant = 0.0
        coef: list[float] = []
        outs: list[int] = []
        ins: list[int] = []
        for node, ngroup in zip(self.ir_graph.nodes, self._node_group, strict=True):
            if node.flops == 0 or (kinds is not None and node.kind not in kinds):
                continue
            wname = f"{node.module}.weight"
            if node.kind in _WEIGHTED and wname in self._state:
                shape = self._state[wname].shape
                out_sl = self._slices(wname, 0)
                in_sl = self._slices(wname, 1) if len(shape) > 1 and node.kind != "norm" else []
                out_parts = [(g, n / shape[0]) for g, n in out_sl]
                out_parts.append((-1, 1.0 - sum(f for _, f in out_parts)))
                in_parts = [(g, n / shape[1]) for g, n in in_sl] if in_sl else []
                in_parts.append((-1, 1.0 - sum(f for _, f in in_parts)))
                for go, fo in out_parts:
                    for gi, fi in in_parts:
                        share = node.flops * fo * fi
                        if share <= 0:
                            continue
                        if go < 0 and gi < 0:
                            constant += share
                        else:
                            coef.append(share)
                            outs.append(go)
                            ins.append(gi)
            elif ngroup >= 0:
                coef.append(float(node.flops))
                outs.append(int(ngroup))
                ins.append(-1)
            else:
                constant += node.flops
        return FlopsModel(
            constant=constant,
            coef=np.array(coef, dtype=np.float64),
            out_group=np.array(outs, dtype=np.int64),
            in_group=np.array(ins, dtype=np.int64),
            num_groups=len(self.groups),
        )

    # -- hierarchical graph -----------------------------------------------------------------
    def _hierarchical_graph(self, features: str, bins: int, seed: int) -> HierarchicalGraph:
        nodes = self.ir_graph.nodes
        position = {n.name: i for i, n in enumerate(nodes)}
        total_flops = max(self.ir_graph.total_flops(), 1)
        op_x, op_adj, node_x = [], [], []
        for node in nodes:
            kind = node.kind if node.kind in KIND_VOCAB else "other"
            wname = f"{node.module}.weight"
            weight = (
                self._state[wname].double().numpy()
                if node.kind in _WEIGHTED and wname in self._state
                else None
            )
            chans = node.out_shape[1] if len(node.out_shape) >= 2 else 1
            feats, adj = level1_channel_graph(weight, kind, chans, bins)
            op_x.append(feats)
            op_adj.append(adj)
            spatial = int(np.prod(node.out_shape[2:])) if len(node.out_shape) > 2 else 1
            static = [
                np.log2(chans + 1) / 10.0,
                np.log2(spatial + 1) / 10.0,
                10.0 * node.flops / total_flops,
                np.log2(node.params + 1) / 20.0,
                float(self._node_group[position[node.name]] >= 0),
            ]
            node_x.append(np.concatenate([kind_one_hot(kind), np.array(static, dtype=np.float32)]))
        edges = [
            (position[src], position[n.name]) for n in nodes for src in n.inputs if src in position
        ]
        op_x_arr = np.stack(op_x).astype(np.float32)
        node_x_arr = np.stack(node_x).astype(np.float32)
        if features == "random":
            rng = np.random.default_rng(seed)
            op_x_arr = rng.standard_normal(op_x_arr.shape).astype(np.float32)
            node_x_arr = rng.standard_normal(node_x_arr.shape).astype(np.float32)
        return HierarchicalGraph(
            op_x=op_x_arr,
            op_adj=np.stack(op_adj).astype(np.float32),
            node_x=node_x_arr,
            edge_index=np.array(edges, dtype=np.int64).reshape(-1, 2).T.copy(),
            node_group=self._node_group.copy(),
            num_groups=len(self.groups),
            names=tuple(n.name for n in nodes),
        )
