"""Weight sharing between a supernet and its extracted subnets.

The supernet's parameters live in one flat vector (each ``nn.Parameter`` is a view
into it). An extracted subnet is a real, smaller ``nn.Module`` with its own tensors;
a :class:`SubnetBinding` knows, for every element of every subnet tensor, which flat
index of the supernet it came from. The binding is found without any knowledge of
the extractor: every supernet element is temporarily overwritten with its own flat index
(a *code*), the subnet is extracted, and its tensors then hold the codes of the supernet
elements they were sliced from.

With that map, *fork* is a gather (``subnet = flat[codes]``) and a subnet's gradient
goes back with ``index_add`` together with a coverage count per supernet element.
:func:`parameter_coverage` shows, for one supernet parameter, the element counts of
several subnets and the leading slice each of them keeps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hpcnb.errors import InvalidInputError

__all__ = [
    "FlatParameters",
    "ParameterCoverage",
    "SubnetBinding",
    "bind_subnet",
    "parameter_coverage",
]


class FlatParameters:
    """Make every parameter and floating buffer of ``model`` a view into flat vectors.

    Args:
        model: The supernet; its parameters are re-pointed in place.

    Attributes:
        params: Flat vector holding all trainable parameters (in ``named_parameters`` order).
        grads: Flat gradient vector; each parameter's ``.grad`` is a view into it.
        buffers: Flat vector of floating-point buffers (BN running statistics).
        param_names: Parameter names in flat order, with offsets in ``param_offsets``.
    """

    def __init__(self, model: nn.Module) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise InvalidInputError(
                f"{type(model).__name__}: the model has no trainable parameters"
            )
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) != 1:
            raise InvalidInputError(f"{type(model).__name__}: mixed parameter dtypes {dtypes}")
        dtype = dtypes.pop()
        self.model = model
        self.param_names = [n for n, _ in named]
        sizes = [p.numel() for _, p in named]
        self.param_offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        self.params = torch.cat([p.detach().reshape(-1) for _, p in named]).to(dtype)
        self.grads = torch.zeros_like(self.params)
        for (_, p), lo, hi in zip(
            named, self.param_offsets[:-1], self.param_offsets[1:], strict=True
        ):
            p.data = self.params[lo:hi].view(p.shape)
            p.grad = self.grads[lo:hi].view(p.shape)
        bnamed = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
        self.buffer_names = [n for n, _ in bnamed]
        bsizes = [b.numel() for _, b in bnamed]
        self.buffer_offsets = [0, *torch.tensor(bsizes, dtype=torch.long).cumsum(0).tolist()]
        self.buffers = (
            torch.cat([b.detach().reshape(-1) for _, b in bnamed]).to(dtype)
            if bnamed
            else torch.zeros(0, dtype=dtype)
        )
        for (name, _), lo, hi in zip(
            bnamed, self.buffer_offsets[:-1], self.buffer_offsets[1:], strict=True
        ):
            owner, attr = _owner(model, name)
            old = getattr(owner, attr)
            owner._buffers[attr] = self.buffers[lo:hi].view(old.shape)

    @property
    def numel(self) -> int:
        """Number of trainable scalars in the supernet."""
        return int(self.params.numel())

    def refresh_grad_views(self) -> None:
        """Point every parameter's ``.grad`` at the flat gradient vector again.

        Optimisers and ``zero_grad(set_to_none=True)`` may drop the views.
        """
        for name, lo, hi in zip(
            self.param_names, self.param_offsets[:-1], self.param_offsets[1:], strict=True
        ):
            p = self.model.get_parameter(name)
            p.grad = self.grads[lo:hi].view(p.shape)


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


@dataclass
class SubnetBinding:
    """A subnet module and the supernet flat indices of each of its tensors.

    Attributes:
        module: The extracted subnet (its own tensors, refreshed by :meth:`pull`).
        param_codes: ``{subnet parameter name: LongTensor of supernet flat indices}``.
        buffer_codes: ``{subnet buffer name: LongTensor of supernet buffer indices}``.
        flat: The supernet's flat storage.
    """

    module: nn.Module
    param_codes: dict[str, torch.Tensor]
    buffer_codes: dict[str, torch.Tensor]
    flat: FlatParameters

    def covered(self) -> torch.Tensor:
        """Return the sorted unique supernet indices this subnet uses."""
        return torch.unique(torch.cat([c.reshape(-1) for c in self.param_codes.values()]))

    def numel(self) -> int:
        """Number of trainable scalars of the subnet."""
        return sum(int(c.numel()) for c in self.param_codes.values())

    @torch.no_grad()
    def pull(self, params: torch.Tensor | None = None) -> nn.Module:
        """Fork: copy the current shared weights into the subnet; return the module.

        Args:
            params: Flat parameter vector to read (default: the supernet's own).
        """
        src = self.flat.params if params is None else params
        for name, codes in self.param_codes.items():
            p = self.module.get_parameter(name)
            p.copy_(src[codes])
            p.grad = None
        for name, codes in self.buffer_codes.items():
            self.module.get_buffer(name).copy_(self.flat.buffers[codes])
        return self.module

    @torch.no_grad()
    def push_grad(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Add the subnet's gradients and a coverage count of one into flat accumulators.

        Args:
            sums: Flat gradient sums (float64 recommended), modified in place.
            counts: Flat coverage counts, modified in place.
        """
        for name, codes in self.param_codes.items():
            p = self.module.get_parameter(name)
            flat_codes = codes.reshape(-1)
            counts.index_add_(0, flat_codes, torch.ones_like(flat_codes, dtype=counts.dtype))
            if p.grad is not None:
                sums.index_add_(0, flat_codes, p.grad.reshape(-1).to(sums.dtype))

    @torch.no_grad()
    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(flat codes, current values)`` of the subnet's parameters."""
        codes = torch.cat([c.reshape(-1) for c in self.param_codes.values()])
        vals = torch.cat(
            [self.module.get_parameter(n).detach().reshape(-1) for n in self.param_codes]
        )
        return codes, vals


def bind_subnet(
    flat: FlatParameters,
    coded: nn.Module,
    extractor: Callable[[nn.Module], nn.Module],
) -> SubnetBinding:
    """Extract a subnet from the coded copy and read off its supernet indices.

    Args:
        flat: The supernet's flat storage.
        coded: The supernet with every element set to its flat index.
        extractor: Maps a model (with the supernet's structure) to the subnet module.

    Raises:
        InvalidInputError: The extractor changed values (a subnet element is not a copy of one
            supernet element), so weights cannot be shared.
    """
    module = copy.deepcopy(extractor(coded))  # never share tensors with the supernet
    total_p, total_b = flat.numel, int(flat.buffers.numel())
    param_codes: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        codes = _read_codes(p.detach(), name, 0, total_p)
        param_codes[name] = codes
    buffer_codes: dict[str, torch.Tensor] = {}
    for name, b in module.named_buffers():
        if b.is_floating_point() and b.numel():
            try:
                codes = _read_codes(b, name, total_p, total_p + total_b)
            except InvalidInputError:
                continue  # a constant the extractor made itself: not shared, kept as is
            buffer_codes[name] = codes - total_p
    binding = SubnetBinding(module, param_codes, buffer_codes, flat)
    binding.pull()
    return binding


def _read_codes(values: torch.Tensor, name: str, lo: int, hi: int) -> torch.Tensor:
    rounded = torch.round(values.double())
    if values.numel() and (
        not torch.equal(rounded, values.double())
        or rounded.min().item() < lo
        or rounded.max().item() >= hi
    ):
        raise InvalidInputError(
            f"subnet tensor {name!r}: its values are not copies of supernet elements "
            f"(expected integer codes in [{lo}, {hi})); the extractor must slice, not compute"
        )
    return rounded.long()


@dataclass(frozen=True)
class ParameterCoverage:
    """How several subnets cover the elements of one supernet parameter.

    Attributes:
        name: The parameter's name in the supernet.
        counts: Tensor of the parameter's shape: how many of the subnets use each element.
        kept: Per subnet, the size in each dimension of the block it uses (from index 0
            in every dimension), or ``None`` when it uses no element (a skipped block).
        leading: Per subnet, whether the elements it uses are exactly that leading block.
    """

    name: str
    counts: torch.Tensor
    kept: tuple[tuple[int, ...] | None, ...]
    leading: tuple[bool, ...]


def parameter_coverage(
    flat: FlatParameters, bindings: Sequence[SubnetBinding], name: str
) -> ParameterCoverage:
    """Count which subnets use each element of one supernet parameter, and their slices.

    Args:
        flat: The supernet's flat storage.
        bindings: The subnets' bindings (:meth:`~hpcnb.supernet.Supernet.bind`).
        name: A parameter name of the supernet (one of ``flat.param_names``).

    Raises:
        InvalidInputError: ``name`` is not a trainable parameter of the supernet.
    """
    if name not in flat.param_names:
        raise InvalidInputError(f"{name!r} is not a trainable parameter of the supernet")
    i = flat.param_names.index(name)
    lo, hi = flat.param_offsets[i], flat.param_offsets[i + 1]
    shape = flat.model.get_parameter(name).shape
    counts = torch.zeros(hi - lo, dtype=torch.long)
    kept: list[tuple[int, ...] | None] = []
    leading: list[bool] = []
    for binding in bindings:
        codes = binding.covered()
        mask = torch.zeros(hi - lo, dtype=torch.bool)
        mask[codes[(codes >= lo) & (codes < hi)] - lo] = True
        counts += mask.long()
        block = mask.view(shape)
        if not block.any():
            kept.append(None)
            leading.append(True)
            continue
        sizes = tuple(_extent(block, axis) for axis in range(block.dim()))
        kept.append(sizes)
        expected = torch.zeros_like(block)
        expected[tuple(slice(0, k) for k in sizes)] = True
        leading.append(bool(torch.equal(block, expected)))
    return ParameterCoverage(name, counts.view(shape), tuple(kept), tuple(leading))


def _extent(block: torch.Tensor, axis: int) -> int:
    """One past the last index along ``axis`` where ``block`` has a true element."""
    others = tuple(d for d in range(block.dim()) if d != axis)
    used = block.any(dim=others) if others else block
    return int(used.nonzero().max()) + 1
