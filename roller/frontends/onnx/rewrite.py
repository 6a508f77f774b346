"""Rewrites of the ONNX graph before translation."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every inference BatchNormalization that follows a Conv folded into it:
    W' = W * s[f], b' = (b - mean) * s + beta with s = scale / sqrt(var + eps). Only where the convolution
    feeds nothing else and all the parameters are initializers (so nothing else sees the unfolded output).
    ``model`` itself where it has no BatchNormalization (the copy cost 0.2 s of BERT-base's import)."""
    if not any(n.op_type == "BatchNormalization" for n in model.graph.node):
        return model
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


def drop_unused_outputs(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` with every optional output that nothing reads left unnamed (what an exporter writes when it
    does not want it): Dropout's mask, MaxPool's indices, BatchNormalization's statistics of training, as
    older exporters name them. Which outputs are optional, the operator's schema at ``opset`` says; a model
    that reads such an output keeps it (and its translation says whether it is supported)."""
    g = model.graph
    read = _read_names(g) | {o.name for o in g.output}
    todo = []
    for k, node in enumerate(g.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        unread = [i for i, o in enumerate(node.output) if i > 0 and o and o not in read]
        if not unread:
            continue
        try:
            formal = onnx.defs.get_schema(node.op_type, opset).outputs
        except onnx.defs.SchemaError:
            continue
        optional = onnx.defs.OpSchema.FormalParameterOption.Optional
        drop = [i for i in unread if i < len(formal) and formal[i].option == optional]
        if drop:
            todo.append((k, drop))
    if not todo:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, drop in todo:
        node = out.graph.node[k]
        for i in drop:
            node.output[i] = ""
        while node.output and not node.output[-1]:   # trailing unnamed outputs are simply absent
            node.output.pop()
    return out


def _read_names(g: onnx.GraphProto) -> set[str]:
    """Every name a node of ``g`` reads, in its subgraphs too (a subgraph may read an outer value)."""
    out = set()
    for n in g.node:
        out.update(n.input)
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                out |= _read_names(sub)
    return out


class OpsetUpgrade(UserWarning):
    """A model of an opset older than the importer reads was upgraded at import (onnx.version_converter)."""


def upgrade_opset(model: onnx.ModelProto, version: int, to: int, source: str) -> onnx.ModelProto:
    """``model`` (default-domain opset ``version``) converted to opset ``to`` by onnx's version converter, with a
    one-line warning saying so; InputError where the converter cannot."""
    import warnings

    from roller.errors import InputError

    try:
        out = onnx.version_converter.convert_version(model, to)
    except Exception as err:  # noqa: BLE001 - the converter raises plain RuntimeErrors and others
        first = (str(err).strip().splitlines() or [err.__class__.__name__])[0][:300]
        raise InputError(f"opset {version} could not be upgraded to {to} (onnx.version_converter: {first}); "
                         f"opsets {to} and later are read", source=source) from None
    warnings.warn(f"{source}: opset {version} upgraded to {to} at import (onnx.version_converter)", OpsetUpgrade,
                  stacklevel=3)
    return out
