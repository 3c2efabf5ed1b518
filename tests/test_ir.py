"""Tests for hpcnb.ir and hpcnb.models: trace, costs vs FlopCounterMode, groups, extraction."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hpcnb import models
from hpcnb.ir import KINDS, IRTraceError, trace
from hpcnb.ir.graph import COUNTED_KINDS

ZOO_NAMES = sorted(models.ZOO)


def _reference_flops(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_trace_and_flops_match_flop_counter(name: str) -> None:
    spec = models.ZOO[name]
    model = spec.build("tiny")
    x = spec.example_input("tiny", batch=2)
    graph = trace(model, x)
    assert graph.unsupported() == []
    assert all(n.kind in KINDS for n in graph.nodes)
    assert graph.total_params() == sum(p.numel() for p in model.parameters())
    ours = sum(v for k, v in graph.flops_by_kind().items() if k in COUNTED_KINDS)
    ref = _reference_flops(model, x)
    assert ref > 0
    assert abs(ours - ref) <= 0.01 * ref, (ours, ref)
    out = [n for n in graph.nodes if n.kind == "output"]
    assert len(out) == 1
    assert graph.activation_bytes() > 0
    assert sum(graph.flops_by_module().values()) == graph.total_flops()


def test_default_sizes_build_and_trace() -> None:
    for name in ("resnet", "vit", "mamba"):
        spec = models.ZOO[name]
        model = spec.build("default")
        x = spec.example_input("default", batch=1)
        graph = trace(model, x)
        assert graph.node("x").out_shape == (1, 3, 32, 32)
        assert graph.total_flops() > 0


def test_node_fields_for_a_conv() -> None:
    model = models.resnet_cifar(8, 8, 10, 1).eval()
    graph = trace(model, torch.randn(2, 1, 8, 8))
    conv = next(n for n in graph.nodes if n.module == "stem.0")
    assert conv.kind == "conv"
    assert conv.in_shapes == [(2, 1, 8, 8)]
    assert conv.out_shape == (2, 8, 8, 8)
    assert conv.params == 8 * 1 * 9
    assert conv.flops == 2 * (2 * 8 * 8 * 8) * 9
    assert conv.bytes_written == 2 * 8 * 8 * 8 * 4
    assert conv.bytes_read == (2 * 64 + 72) * 4
    assert conv.dtype == "float32"


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


class WithBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x))


def test_untraceable_model_names_module_and_suggests_leaf() -> None:
    model = WithBranch()
    with pytest.raises(IRTraceError, match=r"module 'gate' \(DataDependent\).*leaf_modules"):
        trace(model, torch.randn(2, 4))
    graph = trace(model, torch.randn(2, 4), leaf_modules=("gate",))
    assert [n.name for n in graph.unsupported()] == ["gate"]
    graph = trace(model, torch.randn(2, 4), leaf_modules=(DataDependent,))
    assert graph.count_by_kind()["other"] == 1
    with pytest.raises(ValueError, match="not a sub-module path"):
        trace(model, torch.randn(2, 4), leaf_modules=("nope",))
