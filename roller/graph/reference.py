"""A graph evaluated step by step with ``roller.reference`` (numpy, float64 inside): the second opinion on a
model when onnxruntime is not installed, and node by node, where a model's output first goes wrong."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from roller.graph.ir import CopyNode, Graph, OpNode, ViewNode
from roller.ir.reference import reference
from roller.program import pad_input


def evaluate(graph: Graph, inputs: Mapping[str, np.ndarray], keep: bool = False) -> dict[str, np.ndarray]:
    """The graph's outputs (every value's, with ``keep``) for ``inputs`` by name."""
    env: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
    env.update(graph.constants)
    for n in graph.nodes:
        out = graph.values[n.output]
        if isinstance(n, OpNode):
            args = {t.name: env[v] for t, v in zip(n.expr.inputs, n.inputs)}
            y = reference(n.expr, args).reshape(out.shape)
            if out.border is not None:   # the kernel writes the interior; the plan's buffer holds the fill
                y = pad_input(y[out.border.interior(out.shape)], out.border.pads, out.border.fill)
            env[n.output] = y
        elif isinstance(n, ViewNode):
            env[n.output] = env[n.input].reshape(out.shape)
        elif isinstance(n, CopyNode):
            y = np.zeros(out.shape, dtype=np.float32)
            for p in n.pieces:
                src = tuple(slice(s, s + c) for s, c in zip(p.src_start, p.shape))
                dst = tuple(slice(s, s + c) for s, c in zip(p.dst_start, p.shape))
                y[dst] = env[p.source][src]
            env[n.output] = y
    if keep:
        return env
    return {o: env[o] for o in graph.outputs}
