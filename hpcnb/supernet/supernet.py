"""OSF supernet formation: a pretrained model turned into a weight-sharing supernet.

:meth:`Supernet.from_model` traces the model with :mod:`hpcnb.ir`, takes the IR's
channel-dependency groups (widths, hidden units, attention heads) and its skippable
residual blocks (depth) as the elastic dimensions, optionally reorders channels so that
the first ``k`` are the most important, and keeps the model's weights as the shared
weights. A subnet is extracted by :func:`hpcnb.ir.extract` — a real, smaller dense
``nn.Module`` built by graph traversal from leading slices — and bound to the shared
weights through :mod:`hpcnb.supernet.sharing`. No rule in this module names an
architecture.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from hpcnb.errors import InvalidInputError

from .sharing import (
    FlatParameters,
    ParameterCoverage,
    SubnetBinding,
    bind_subnet,
    parameter_coverage,
)
from .space import Dimension, SearchSpace, SubnetConfig, width_choices

if TYPE_CHECKING:
    from hpcnb.ir import Graph

ExampleInputs = torch.Tensor | tuple[torch.Tensor, ...]
"""Example inputs of a model: one tensor or a tuple of them."""

__all__ = ["Supernet"]

Extractor = Callable[[nn.Module, dict[str, int], tuple[str, ...]], nn.Module]


class Supernet:
    """A weight-sharing supernet over an elastic search space.

    Args:
        model: The supernet model; its parameters become views of one flat vector.
        space: The elastic dimensions.
        extractor: ``extractor(model, keep, skip_blocks)`` returns the subnet module,
            where ``keep`` maps width/head dimension names to the number kept (leading
            slices) and ``skip_blocks`` names the depth dimensions set to 0.
        example_inputs: Inputs used to count FLOPs of subnets.
        flop_counter: ``flop_counter(module, example_inputs)`` (default: the IR's trace).
        graph: The IR graph the space was read from (:meth:`from_model`), if any.
        cache_size: Number of bound subnets kept.
    """

    def __init__(
        self,
        model: nn.Module,
        space: SearchSpace,
        extractor: Extractor,
        example_inputs: ExampleInputs,
        *,
        flop_counter: Callable[[nn.Module, ExampleInputs], int] | None = None,
        graph: Graph | None = None,
        cache_size: int = 64,
    ) -> None:
        self.model = model
        self.space = space
        self.graph = graph
        self.example_inputs = example_inputs
        self._extractor = extractor
        self._flop_counter = flop_counter or _ir_flops
        self.flat = FlatParameters(model)
        self._cache: OrderedDict[SubnetConfig, SubnetBinding] = OrderedDict()
        self._cache_size = cache_size
        self._flops: dict[SubnetConfig, int] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        example_inputs: torch.Tensor | tuple[torch.Tensor, ...],
        *,
        width_ratios: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
        head_ratios: Sequence[float] | None = None,
        depth: bool = True,
        reorder: bool = True,
        leaf_modules: Sequence[type[nn.Module]] = (),
        min_width: int = 1,
        cache_size: int = 64,
    ) -> Supernet:
        """Convert a (pretrained) model into a supernet through the IR.

        Every prunable IR group of size > 1 becomes a width dimension (a ``"head"``
        group a heads dimension) with sizes ``ceil(size * ratio)``; every skippable
        residual block becomes a depth dimension. The same code serves every
        architecture the IR can trace.

        Args:
            model: The model; it is modified in place (channel reorder, flat weights).
            example_inputs: Example inputs for tracing.
            width_ratios: Kept fractions for width dimensions.
            head_ratios: Kept fractions for head dimensions (default ``width_ratios``).
            depth: Add depth dimensions for skippable residual blocks.
            reorder: Reorder channels by importance first (first-k keeps the best).
            leaf_modules: Module types the tracer keeps as leaves.
            min_width: Smallest size of a width dimension.
            cache_size: Number of bound subnets kept.

        Raises:
            InvalidInputError: The model yields no elastic dimension.
        """
        from hpcnb import ir

        model.eval()
        graph = ir.trace(model, example_inputs, leaf_modules=tuple(leaf_modules))
        if reorder:
            ir.reorder(model, graph)
        dims: list[Dimension] = []
        for group in graph.groups():
            if not group.prunable or group.size < 2:
                continue
            kind = "heads" if group.kind == "head" else "width"
            ratios = head_ratios if (kind == "heads" and head_ratios) else width_ratios
            label = ", ".join(sorted({m.param for m in group.members})[:3])
            dims.append(
                Dimension(
                    name=group.id,
                    kind=kind,
                    choices=width_choices(group.size, ratios, min_width),
                    full=group.size,
                    label=label,
                )
            )
        if depth:
            for block in graph.blocks():
                dims.append(Dimension(name=block, kind="depth", choices=(0, 1), full=1))
        if not dims:
            raise InvalidInputError(
                f"{type(model).__name__}: the IR found no prunable group and no skippable "
                "block, so there is nothing elastic"
            )

        def extractor(m: nn.Module, keep: dict[str, int], skip: tuple[str, ...]) -> nn.Module:
            return ir.extract(m, graph, keep=keep, skip_blocks=skip)

        return cls(
            model,
            SearchSpace(dims),
            extractor,
            example_inputs,
            graph=graph,
            cache_size=cache_size,
        )

    # ------------------------------------------------------------------ space
    def sample(self, rng: np.random.Generator) -> SubnetConfig:
        """Draw a configuration uniformly from the space."""
        return self.space.sample(rng)

    def max(self) -> SubnetConfig:
        """Return the largest configuration."""
        return self.space.max()

    def min(self) -> SubnetConfig:
        """Return the smallest configuration."""
        return self.space.min()

    def keep_for(self, config: SubnetConfig) -> tuple[dict[str, int], tuple[str, ...]]:
        """Return ``(keep, skip_blocks)`` of a configuration for the extractor."""
        self.space.validate(config)
        keep: dict[str, int] = {}
        skip: list[str] = []
        for d, v in zip(self.space.dims, config.values, strict=True):
            if d.kind == "depth":
                if v == 0:
                    skip.append(d.name)
            else:
                keep[d.name] = int(v)
        return keep, tuple(skip)

    def summary(self) -> dict[str, float]:
        """Return the space's dimensions by kind, its size, and the FLOPs range."""
        kinds = {k: sum(d.kind == k for d in self.space.dims) for k in ("width", "heads", "depth")}
        return {
            "width_dims": kinds["width"],
            "head_dims": kinds["heads"],
            "depth_dims": kinds["depth"],
            "space_size": self.space.size(),
            "params": self.flat.numel,
            "max_flops": self.flops(self.max()),
            "min_flops": self.flops(self.min()),
        }

    # ------------------------------------------------------------------ subnets
    def bind(self, config: SubnetConfig) -> SubnetBinding:
        """Return the (cached) binding of a subnet to the shared weights."""
        binding = self._cache.get(config)
        if binding is not None:
            self._cache.move_to_end(config)
            return binding
        keep, skip = self.keep_for(config)
        with self._coded():
            binding = bind_subnet(self.flat, self.model, lambda m: self._extractor(m, keep, skip))
        binding.pull()
        self._cache[config] = binding
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return binding

    def extract(self, config: SubnetConfig) -> nn.Module:
        """Return an independent copy of the subnet with the current shared weights."""
        module = copy.deepcopy(self.bind(config).pull())
        for p in module.parameters():
            p.grad = None
        return module.eval()

    def coverage(self, configs: Sequence[SubnetConfig], name: str) -> ParameterCoverage:
        """Return how the subnets ``configs`` cover the shared parameter ``name``.

        Args:
            configs: The subnets (e.g. one training step's).
            name: A parameter name of the supernet model.
        """
        return parameter_coverage(self.flat, [self.bind(c) for c in configs], name)

    def flops(self, config: SubnetConfig) -> int:
        """Return the FLOPs (multiply-add = 2) of one forward pass of a subnet."""
        if config not in self._flops:
            module = self.bind(config).module
            self._flops[config] = int(self._flop_counter(module, self.example_inputs))
        return self._flops[config]

    def params(self, config: SubnetConfig) -> int:
        """Return the number of trainable parameters of a subnet."""
        return self.bind(config).numel()

    def forward(self, config: SubnetConfig, x: torch.Tensor) -> torch.Tensor:
        """Run a subnet on ``x`` with the current shared weights (eval mode, no grad).

        Args:
            config: The subnet.
            x: Inputs.
        """
        module = self.bind(config).pull().eval()
        with torch.no_grad():
            return module(x)

    @contextlib.contextmanager
    def _coded(self) -> Iterator[None]:
        """Temporarily fill the shared weights with their own flat indices."""
        flat = self.flat
        total_p = flat.numel
        if total_p + int(flat.buffers.numel()) >= 2**24:
            raise InvalidInputError(
                f"supernet has {total_p} parameters; subnet binding needs fewer than 2**24"
            )
        saved_p = flat.params.clone()
        saved_b = flat.buffers.clone()
        try:
            with torch.no_grad():
                flat.params.copy_(torch.arange(total_p, dtype=flat.params.dtype))
                flat.buffers.copy_(
                    torch.arange(total_p, total_p + flat.buffers.numel(), dtype=flat.buffers.dtype)
                )
            yield
        finally:
            with torch.no_grad():
                flat.params.copy_(saved_p)
                flat.buffers.copy_(saved_b)


def _ir_flops(module: nn.Module, example_inputs: ExampleInputs) -> int:
    from hpcnb import ir

    return int(ir.trace(module, example_inputs).total_flops())
