"""Tests for the op registry, the leaf protocol and the module structure of hpcnb.ir."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.fx
from torch import nn

from hpcnb import models
from hpcnb.ir import extract, trace
from hpcnb.ir.groups import analyse_channels
from hpcnb.ir.leaf import IRLeaf, is_ir_leaf
from hpcnb.ir.ops import OpCall, OpSpec, op_kind, op_spec, register_op
from hpcnb.ir.rules import elementwise_rule


class ChannelGate(nn.Module):
    """A user op: ``x * sigmoid(w)`` with one learned gate per channel (last axis)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.w)


def _gate_channels(a, node, in_axes):
    x = in_axes[0]
    a.unify(x[-1], a.param("w", 0))
    return list(x)


def _gate_refresh(module: nn.Module) -> None:
    module.channels = module.w.shape[0]


def scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A user function kept opaque by fx (``torch.fx.wrap``)."""
    return x + 0.5 * y


torch.fx.wrap("scaled_add")


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(4, 6)
        self.gate = ChannelGate(6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(scaled_add(self.a(x), self.b(x))))


@pytest.fixture(scope="module")
def registered():
    register_op(
        ChannelGate,
        OpSpec(
            "mul",
            flops=lambda call: 2 * call.out_numel,
            bytes=lambda call: (call.bytes_read + 1, 2 * call.bytes_written),
            channel_rule=_gate_channels,
            refresh=_gate_refresh,
        ),
    )
    add = OpSpec("add", flops=lambda call: 2 * call.out_numel, channel_rule=elementwise_rule)
    register_op(scaled_add, add)


def test_custom_module_and_function_ops_flow_through_trace_costs_groups_extract(registered) -> None:
    torch.manual_seed(0)
    model = Custom().eval()
    x = torch.randn(3, 4)
    graph = trace(model, x)
    assert graph.unsupported() == []
    gate = next(n for n in graph.nodes if n.module == "gate")
    assert gate.op == "call_module" and gate.kind == "mul" and gate.flops == 2 * 3 * 6
    assert (gate.bytes_read, gate.bytes_written) == ((3 * 6 + 6) * 4 + 1, 2 * 3 * 6 * 4)
    add = next(n for n in graph.nodes if n.target == "scaled_add")
    assert add.op == "call_function" and add.kind == "add" and add.flops == 2 * 3 * 6
    (group,) = graph.prunable_groups()
    assert group.size == 6 and group.modules == ("a", "b", "gate", "head")
    members = {(m.param, m.axis) for m in group.members}
    assert {("a.weight", 0), ("b.weight", 0), ("gate.w", 0), ("head.weight", 1)} <= members
    keep = [5, 0, 2]
    small = extract(model, graph, {group.id: keep})
    assert small.get_submodule("gate").w.shape == (3,)
    assert small.get_submodule("gate").channels == 3  # the registered refresh ran
    with torch.no_grad():
        h = scaled_add(model.a(x)[:, keep], model.b(x)[:, keep]) * torch.sigmoid(model.gate.w[keep])
        want = h @ model.head.weight[:, keep].T + model.head.bias
        assert torch.allclose(small(x), want, atol=1e-6)
    assert trace(small, x).total_flops() < graph.total_flops()


def test_registry_lookup_and_bad_registrations() -> None:
    assert op_spec(None, nn.Conv2d(1, 1, 1)).kind == "conv"
    assert op_spec(None, nn.LazyLinear(3)).kind == "linear"  # subclasses match their base
    assert op_spec("relu").kind == "activation" and op_spec(torch.relu).kind == "activation"
    assert op_spec("no_such_op") is None
    assert op_kind("call_function", "no_such_op", None, True) == "other"
    assert op_kind("call_function", "size", None, False) == "size"
    with pytest.raises(ValueError, match="kind 'convolution'"):
        OpSpec("convolution")
    with pytest.raises(TypeError, match=r"not an nn\.Module"):
        register_op(int, OpSpec("other"))
    with pytest.raises(TypeError, match="OpSpec"):
        register_op("relu", "activation")
    relu = op_spec("relu")
    with pytest.raises(ValueError, match="registered already"):  # nothing overwritten silently
        register_op(("my_new_op", "relu"), OpSpec("other"))
    assert op_spec("relu") is relu and op_spec("my_new_op") is None  # all or nothing
    call = OpCall("relu", None, ((2, 3),), (2, 3))
    assert call.out_numel == 6 and op_spec("relu").flops(call) == 6


def test_leaf_protocol_is_one_check() -> None:
    attn = models.MultiHeadSelfAttention(8, 2)
    assert isinstance(attn, IRLeaf) and is_ir_leaf(attn) and is_ir_leaf(models.SelectiveScan(4, 2))
    assert not is_ir_leaf(nn.Linear(2, 2))

    class Partial(nn.Module):
        ir_kind = "attention"  # no ir_flops / ir_channels / ir_refresh

    assert not is_ir_leaf(Partial())


def test_with_prefix_is_a_context_manager_and_analysis_is_explicit() -> None:
    spec = models.ZOO["vit"]
    model, x = spec.build("tiny"), spec.example_input("tiny")
    graph = trace(model, x)
    analysis = analyse_channels(graph)
    full = analysis.param("blocks.0.attn.qkv.weight", 1)
    with analysis.with_prefix("blocks.0.attn.") as ctx:
        assert ctx.param("qkv.weight", 1) == full
        with pytest.raises(RuntimeError), analysis.with_prefix("head."):
            raise RuntimeError("restores the outer prefix")
        assert ctx.param("qkv.weight", 1) == full  # still relative to the attention block
    assert analysis.param("qkv.weight", 1) == []  # prefix reset: no such parameter
    keep = {g.id: 1 for g in analysis.groups if g.prunable and g.kind == "head"}
    with torch.no_grad():
        a = extract(model, graph, keep, channels=analysis)(x)
        b = extract(model, graph, keep)(x)
    assert torch.equal(a, b)


def _imports(pkg_dir: pathlib.Path, pkg: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions."""
    mods = {p.stem for p in pkg_dir.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in pkg_dir.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name == pkg and path.stem != "__init__":
                    deps.add("__init__")
                elif name.startswith(pkg + ".") and name.split(".")[2] in mods:
                    deps.add(name.split(".")[2])
        edges[path.stem] = deps - {path.stem}
    return edges


@pytest.mark.parametrize("pkg", ["hpcnb.ir", "hpcnb.models"])
def test_no_import_cycle(pkg: str) -> None:
    root = pathlib.Path(__file__).resolve().parents[1]
    edges = _imports(root.joinpath(*pkg.split(".")), pkg)
    assert not any("__init__" in deps for m, deps in edges.items() if m != "__init__")
    state: dict[str, int] = {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for dep in edges.get(module, ()):
            assert state.get(dep) != 1, " -> ".join([*stack, module, dep])
            if dep not in state:
                visit(dep, [*stack, module])
        state[module] = 2

    for module in edges:
        if module not in state:
            visit(module, [])
