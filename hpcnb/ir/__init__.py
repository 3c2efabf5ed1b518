"""Graph IR over torch.fx: op kinds, shapes, costs, channel groups, extraction, exports.

>>> from hpcnb import models
>>> from hpcnb.ir import trace, extract
>>> spec = models.ZOO["resnet"]
>>> model, x = spec.build("tiny"), spec.example_input("tiny")
>>> graph = trace(model, x)
>>> keep = {g.id: g.size // 2 for g in graph.groups() if g.prunable and g.size > 1}
>>> extract(model, graph, keep)(x).shape
torch.Size([2, 10])

Supporting a new op is one :func:`hpcnb.ir.ops.register_op` (see :mod:`hpcnb.ir.ops`);
a module can also describe itself (:mod:`hpcnb.ir.leaf`). A new op kind is one
:func:`register_kind` (the kinds table, :data:`KINDS`, is :mod:`hpcnb.ir.kinds`).
"""

import hpcnb.ir.torch_ops  # noqa: F401  (registers the PyTorch ops)
from hpcnb.ir.export import PYG_FEATURES, draw_graph, to_networkx, to_pyg
from hpcnb.ir.extract import extract, importance, reorder, uniform_keep
from hpcnb.ir.graph import (
    Block,
    ChannelGroup,
    Graph,
    IRTraceError,
    Node,
    ParamSlice,
    find_blocks,
)
from hpcnb.ir.kinds import KINDS, register_kind
from hpcnb.ir.trace import trace

__all__ = [
    # tracing a model into the IR, the IR's data model, and its op kinds
    "KINDS",
    "ChannelGroup",
    "Graph",
    "IRTraceError",
    "Node",
    "ParamSlice",
    "register_kind",
    "trace",
    # subnets: residual blocks, extraction, channel importance
    "Block",
    "extract",
    "find_blocks",
    "importance",
    "reorder",
    "uniform_keep",
    # exports (PyG, networkx, a drawing: matplotlib is imported on use)
    "PYG_FEATURES",
    "draw_graph",
    "to_networkx",
    "to_pyg",
]
