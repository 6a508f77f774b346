"""Models as graphs of Roller operators, views and copies, planned and run with their data on the device."""
from __future__ import annotations

from roller.graph.ir import CopyNode, Graph, Node, OpNode, Piece, Value, ViewNode
from roller.graph.memory import InputPad, Plan, plan
from roller.graph.passes import kernel_key, remove_dead, unique_kernels

__all__ = ["CopyNode", "Graph", "InputPad", "Node", "OpNode", "Piece", "Plan", "Value", "ViewNode", "kernel_key", "plan",
           "remove_dead", "unique_kernels"]
