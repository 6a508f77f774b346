"""Rewrites of the ONNX graph before translation."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every inference BatchNormalization that follows a Conv folded into it:
    W' = W * s[f], b' = (b - mean) * s + beta with s = scale / sqrt(var + eps). Only where the convolution
    feeds nothing else and all the parameters are initializers (so nothing else sees the unfolded output)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    uses = Counter(i for n in g.node for i in n.input)
    uses.update(o.name for o in g.output)
    producer = {o: n for n in g.node for o in n.output}
    drop: set[int] = set()
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1:
            continue
        if any(a.name == "training_mode" and a.i for a in bn.attribute):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or uses[bn.input[0]] != 1:
            continue
        params = [inits.get(bn.input[i]) for i in range(1, 5)]
        weight = inits.get(conv.input[1])
        bias = inits.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
        if weight is None or any(p is None for p in params) or (len(conv.input) > 2 and conv.input[2] and bias is None):
            continue
        if uses[conv.input[1]] != 1 or (bias is not None and uses[conv.input[2]] != 1):
            continue   # a weight shared with another node keeps its values
        scale, beta, mean, var = (numpy_helper.to_array(p).astype(np.float64) for p in params)  # type: ignore[arg-type]
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        s = scale / np.sqrt(var + eps)
        w = numpy_helper.to_array(weight).astype(np.float64)
        b = numpy_helper.to_array(bias).astype(np.float64) if bias is not None else np.zeros(w.shape[0])
        w_new = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(numpy_helper.to_array(weight).dtype)
        b_new = ((b - mean) * s + beta).astype(w_new.dtype)
        wname, bname = f"{conv.input[1]}:bn", f"{bn.output[0]}:bias"
        g.initializer.append(numpy_helper.from_array(w_new, wname))
        g.initializer.append(numpy_helper.from_array(b_new, bname))
        x = conv.input[0]
        del conv.input[:]
        conv.input.extend([x, wname, bname])
        conv.output[0] = bn.output[0]
        drop.add(id(bn))
    kept = [n for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(kept)
    return out

