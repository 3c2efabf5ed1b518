"""Graph IR over torch.fx: op kinds, shapes, costs, channel groups, extraction, exports."""

from hpcnb.ir.graph import KINDS, ChannelGroup, Graph, IRTraceError, Node, ParamSlice
from hpcnb.ir.trace import trace

__all__ = ["KINDS", "ChannelGroup", "Graph", "IRTraceError", "Node", "ParamSlice", "trace"]
