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
a module can also describe itself (:mod:`hpcnb.ir.leaf`).
"""

import hpcnb.ir.torch_ops  # noqa: F401  (registers the PyTorch ops)
from hpcnb.ir.export import PYG_FEATURES, draw_graph, to_networkx, to_pyg
from hpcnb.ir.extract import extract, importance, reorder, uniform_keep
from hpcnb.ir.graph import (
    COUNTED_KINDS,
    KINDS,
    Block,
    ChannelGroup,
    Graph,
    IRTraceError,
    Node,
    ParamSlice,
    find_blocks,
)
from hpcnb.ir.trace import trace

__all__ = [
    # tracing a model into the IR, and the IR's data model
    "COUNTED_KINDS",
    "KINDS",
    "ChannelGroup",
    "Graph",
    "IRTraceError",
    "Node",
    "ParamSlice",
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
