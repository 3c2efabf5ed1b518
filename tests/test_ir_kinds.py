"""Tests for the op-kind table of hpcnb.ir: one registration per kind, read by ops and features."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from hpcnb.errors import HpcnbError
from hpcnb.ir import KINDS, PYG_FEATURES, register_kind, to_pyg, trace
from hpcnb.ir.kinds import COUNTED_KINDS, GROUPS, UnknownKindError, get_kind, unregister_kind
from hpcnb.ir.ops import OpSpec, register_op
from hpcnb.perfmodel.features import OP_GROUPS, NetworkFeatures, network_features, op_group
from hpcnb.plugins import PluginError

PLUGIN = "hpcnb_test_kind_plugin"

# A user's module, outside the package: one new kind and one op of that kind.
PLUGIN_SOURCE = '''
import torch
from torch import nn

from hpcnb.ir import register_kind
from hpcnb.ir.ops import OpSpec, register_op

register_kind("test_gate", group="activation", doc="a learned per-feature gate")


class Gate(nn.Module):
    """``x * sigmoid(w)``: one learned gate per feature (last axis)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.w)


register_op(Gate, OpSpec("test_gate", flops=lambda call: 2 * call.out_numel))
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    (tmp_path / f"{PLUGIN}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield importlib.import_module(PLUGIN)
    finally:
        sys.modules.pop(PLUGIN, None)
        unregister_kind("test_gate")


def _net(gate: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 6), gate(6), nn.Linear(6, 3)).eval()


def test_a_kind_registered_outside_the_package_reaches_trace_and_features(plugin) -> None:
    assert "test_gate" in KINDS and KINDS[-1] == "test_gate"  # the live view sees it
    model = _net(plugin.Gate)
    graph = trace(model, torch.randn(2, 2, 2, 2))
    gate = next(n for n in graph.nodes if n.module == "2")
    assert gate.kind == "test_gate" and gate.flops == 2 * 2 * 6
    assert op_group("test_gate") == "activation"

    f = network_features(model, (2, 2, 2), training=False)
    assert f.counts["test_gate"] == 1
    launches, flops, _ = f.group_costs["activation"]
    assert (launches, flops) == (1.0, 12.0)  # per sample: 2 FLOPs x 6 features
    assert f.kernels == 3 and f.gemm_kernels == 2  # linear, gate, linear; flatten is a view
    assert f.other_flops == 12.0

    data = to_pyg(graph)
    assert data.x.shape[1] == len(KINDS) + len(PYG_FEATURES)
    assert data.x[data.kinds.index("test_gate"), KINDS.index("test_gate")] == 1.0

    # replacing the kind moves its nodes to another group, with no change to the op
    register_kind("test_gate", group="elementwise", replace=True)
    moved = network_features(model, (2, 2, 2), training=False)
    assert moved.group_costs["activation"][0] == 0.0
    assert moved.group_costs["elementwise"][:2] == (1.0, 12.0)
    assert KINDS.index("test_gate") == len(KINDS) - 1  # keeps its one-hot slot


def test_unknown_kinds_are_refused_with_their_name() -> None:
    with pytest.raises(UnknownKindError, match="OpSpec: op kind 'no_such_kind'"):
        OpSpec("no_such_kind")
    with pytest.raises(UnknownKindError, match="op_group: op kind 'no_such_kind'") as info:
        op_group("no_such_kind")
    assert isinstance(info.value, HpcnbError) and "register_kind" in str(info.value)
    zeros = dict.fromkeys(("params", "conv_flops", "grouped_conv_flops", "linear_flops"), 0)
    zeros |= dict.fromkeys(("other_flops", "activation_bytes", "memory_bytes"), 0)
    zeros |= dict.fromkeys(("train_flops", "train_grouped_flops"), 0)
    features = NetworkFeatures("n", "f", (1,), counts={"no_such_kind": 1}, **zeros)
    with pytest.raises(UnknownKindError, match="no_such_kind"):
        features.kernels  # noqa: B018

    register_kind("test_short_lived", group="pool")
    spec = OpSpec("test_short_lived")
    unregister_kind("test_short_lived")
    with pytest.raises(UnknownKindError, match=r"register_op.*'test_short_lived'"):
        register_op("test_short_lived_op", spec)

    class Leaf(nn.Module):
        ir_kind = "no_such_kind"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

        def ir_flops(self, in_shapes, out_shape) -> int:
            return 0

        def ir_channels(self, ctx, in_axes):
            return in_axes[0]

        def ir_refresh(self) -> None:
            pass

    with pytest.raises(UnknownKindError, match=r"IR leaf Leaf.*'no_such_kind'"):
        trace(nn.Sequential(Leaf()), torch.randn(2, 3))


def test_register_kind_refuses_a_taken_name_and_a_bad_group() -> None:
    before = tuple(KINDS)
    with pytest.raises(PluginError, match=r"'conv' is registered already.*replace=True"):
        register_kind("conv", group="elementwise")
    assert register_kind("conv", group="conv", counted=True) is get_kind("conv")  # the same kind
    with pytest.raises(PluginError, match="group 'dense'"):
        register_kind("test_bad_group", group="dense")
    with pytest.raises(PluginError, match="name"):
        register_kind("pkg.mod:attr", group="pool")
    view = KINDS
    assert tuple(view) == before and view == before  # a view compares like its tuple


def test_built_in_table_pins_the_feature_groups() -> None:
    assert tuple(COUNTED_KINDS) == ("conv", "linear", "matmul", "attention")
    assert all(get_kind(k).group in GROUPS for k in KINDS)
    groups = {k: op_group(k) for k in KINDS}
    assert {k for k, g in groups.items() if g == "dense"} == {
        "conv",
        "linear",
        "matmul",
        "attention",
    }
    assert op_group("conv", grouped_conv=True) == "grouped"
    assert {k: groups[k] for k in ("norm", "activation", "softmax", "pool")} == {
        "norm": "norm",
        "activation": "activation",
        "softmax": "activation",
        "pool": "pool",
    }
    assert set(groups.values()) <= set(OP_GROUPS)
    kernels = {k for k in KINDS if get_kind(k).kernel}
    assert kernels == {
        "conv",
        "linear",
        "matmul",
        "attention",
        "norm",
        "activation",
        "softmax",
        "pool",
        "add",
        "mul",
        "concat",
        "embedding",
        "scan",
    }
