"""A QDQ model's quantized products as ONNX's integer operators, before import.

onnxruntime's quantizer writes a static int8 model as float operators between QuantizeLinear and
DequantizeLinear nodes (its "QDQ" format, the default); onnxruntime itself runs ``DequantizeLinear(x) ->
Conv|MatMul(DequantizeLinear(w) [, DequantizeLinear(bias)]) -> QuantizeLinear`` as one integer kernel (its QDQ
transformer). ``qdq_to_qlinear`` does the same at the ONNX level: each such group becomes one QLinearConv or
QLinearMatMul (``roller.frontends.onnx.quantize``: int8 reads, int32 sums, the requantization fused), so that
the weights stay int8 on the device and the activations between two products are int8. A group that does not
match stays as it is and still runs: the DequantizeLinear of a constant weight folds at import and its float
operator reads the dequantized values.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

#: the weight types of a match (int16 and the 4-bit types stay float)
WEIGHT_TYPES = ("int8", "uint8")


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Initializers and Constant nodes' values (a tensor attribute), by name."""
    lookup = ConstantLookup(g)
    return {name: value for name in lookup.tensors if (value := lookup(name)) is not None}


def _axis(n: onnx.NodeProto, rank: int) -> int:
    axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


def qdq_to_qlinear(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each matching group as one QLinearConv or QLinearMatMul (the model itself where none
    matches). A match asks for constant scales and zero points (all three zero points given), an int8 or uint8
    constant weight quantized per tensor or per output channel, a one-value input and output quantization, an
    int32 bias with no zero point whose scale is the input's times the weight's (as the quantizer writes it),
    and a product that the QuantizeLinear alone reads."""
    g = model.graph
    if not any(n.op_type == "QuantizeLinear" for n in g.node):   # no group: no initializer read twice
        return model
    consts = _constants(g)
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}

    def dq(name: str) -> onnx.NodeProto | None:
        d = producer.get(name)
        if d is None or d.op_type != "DequantizeLinear" or d.domain not in ("", "ai.onnx") or len(d.input) < 3:
            return None
        if any(a.name == "block_size" and a.i for a in d.attribute):
            return None
        if not all(i in consts for i in d.input[1:3]):
            return None
        return d

    def scalar(name: str) -> bool:
        return consts[name].size == 1

    replaced: dict[int, onnx.NodeProto] = {}   # id of the QuantizeLinear -> the node in its place
    removed: set[int] = set()
    added: list[onnx.TensorProto] = []   # weights transposed for a Gemm with transB
    for n in g.node:
        if n.op_type not in ("Conv", "MatMul", "Gemm") or n.domain not in ("", "ai.onnx") or n.output[0] in outputs:
            continue
        gemm = _attrs(n, "alpha", "beta", "transA", "transB") if n.op_type == "Gemm" else {}
        if gemm.get("alpha", 1.0) != 1.0 or gemm.get("beta", 1.0) != 1.0 or gemm.get("transA", 0):
            continue
        flip = bool(gemm.get("transB", 0))
        users = readers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type != "QuantizeLinear" or len(users[0].input) < 3:
            continue
        q = users[0]
        if not all(i in consts for i in q.input[1:3]) or not (scalar(q.input[1]) and scalar(q.input[2])):
            continue
        if any(a.name == "block_size" and a.i for a in q.attribute):
            continue
        dx, dw = dq(n.input[0]), dq(n.input[1])
        if dx is None or dw is None or dw.input[0] not in consts:
            continue
        if not (scalar(dx.input[1]) and scalar(dx.input[2])):
            continue
        w = consts[dw.input[0]]
        if w.dtype.name not in WEIGHT_TYPES or consts[dw.input[1]].shape != consts[dw.input[2]].shape:
            continue
        per = consts[dw.input[1]].size
        channel_axis, channels = (0, w.shape[0]) if n.op_type == "Conv" or flip else (w.ndim - 1, w.shape[-1])
        if n.op_type != "Conv" and w.ndim != 2:
            continue
        if per != 1 and (consts[dw.input[1]].ndim != 1 or per != channels or _axis(dw, w.ndim) != channel_axis):
            continue
        weight = dw.input[0]
        if flip:   # QLinearMatMul's B is [K, N]: the constant weight transposed once, here
            weight = f"{dw.input[0]}:transposed"
            if weight not in consts:
                consts[weight] = np.ascontiguousarray(w.T)
                added.append(numpy_helper.from_array(consts[weight], weight))
        inputs = [dx.input[0], dx.input[1], dx.input[2], weight, dw.input[1], dw.input[2], q.input[1],
                  q.input[2]]
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2]:
            db = producer.get(n.input[2])
            if db is None or db.op_type != "DequantizeLinear" or db.input[0] not in consts or \
                    db.input[1] not in consts:
                continue
            b = consts[db.input[0]]
            zero = consts.get(db.input[2]) if len(db.input) > 2 and db.input[2] else None
            if b.dtype != np.int32 or (zero is not None and np.any(zero != 0)) or b.shape != (channels,):
                continue
            want = np.float32(consts[dx.input[1]].reshape(-1)[0]) * consts[dw.input[1]].astype(np.float32).reshape(-1)
            have = consts[db.input[1]].astype(np.float32).reshape(-1)
            if have.size not in (1, want.size) or not np.allclose(have, want, rtol=1e-6, atol=0):
                continue
            inputs.append(db.input[0])
        kind = "QLinearConv" if n.op_type == "Conv" else "QLinearMatMul"
        node = onnx.helper.make_node(kind, inputs, [q.output[0]], name=n.name or q.name)
        if kind == "QLinearConv":
            node.attribute.extend(n.attribute)
        replaced[id(q)] = node
        removed.add(id(n))
    if not replaced:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(replaced.get(id(n), n) for n in g.node if id(n) not in removed)
    out.graph.initializer.extend(added)
    return out


class ConstantLookup:
    """A graph's constants by name, each converted when first asked for: the expansion runs before the checker,
    and converting every initializer would cost a large model's import (and fail on a malformed one before the
    checker could say what is wrong)."""

    def __init__(self, g: onnx.GraphProto) -> None:
        self.tensors = {t.name: t for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output and n.attribute:
                a = n.attribute[0]
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    self.tensors[n.output[0]] = a.t
        self.values: dict[str, np.ndarray | None] = {}

    def __call__(self, name: str) -> np.ndarray | None:
        if name not in self.values:
            t = self.tensors.get(name)
            try:
                self.values[name] = None if t is None else numpy_helper.to_array(t)
            except (ValueError, TypeError):   # malformed: the checker will say so
                self.values[name] = None
        return self.values[name]


def _float_op(node: onnx.NodeProto, op_type: str, inputs: list[tuple[str, str, str]], scale: str, zero: str,
              **attrs: Any) -> list[onnx.NodeProto]:
    """DequantizeLinear of each (value, scale, zero point), ``op_type`` on the float values, QuantizeLinear to
    ``scale`` and ``zero`` into the node's output."""
    stem = node.name or node.output[0]
    out: list[onnx.NodeProto] = []
    floats = []
    for j, (value, s, z) in enumerate(inputs):
        name = f"{node.output[0]}:dq{j}"
        out.append(onnx.helper.make_node("DequantizeLinear", [value, s, z], [name], name=f"{stem}/dq{j}"))
        floats.append(name)
    result = f"{node.output[0]}:float"
    out.append(onnx.helper.make_node(op_type, floats, [result], name=f"{stem}/{op_type}", **attrs))
    out.append(onnx.helper.make_node("QuantizeLinear", [result, scale, zero], [node.output[0]], name=f"{stem}/q"))
    return out


def _attrs(node: onnx.NodeProto, *names: str) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name in names}


def _contrib(node: onnx.NodeProto, consts: ConstantLookup) -> list[onnx.NodeProto] | None:
    """onnxruntime's quantized contrib ops (domain com.microsoft, written by its quantizer's QOperator format)
    as what they compute: their float op between DequantizeLinear and QuantizeLinear; None for any other node
    (and for a form not handled: channels-last pooling)."""
    i = list(node.input) + [""] * 9
    t = node.op_type
    if t in ("QLinearAdd", "QLinearMul"):
        return _float_op(node, t[len("QLinear"):], [(i[0], i[1], i[2]), (i[3], i[4], i[5])], i[6], i[7])
    if t in ("QLinearSigmoid", "QLinearLeakyRelu"):
        return _float_op(node, t[len("QLinear"):], [(i[0], i[1], i[2])], i[3], i[4], **_attrs(node, "alpha"))
    if t in ("QLinearGlobalAveragePool", "QLinearAveragePool"):
        if any(a.name == "channels_last" and a.i for a in node.attribute):
            return None
        keep = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
        return _float_op(node, t[len("QLinear"):], [(i[0], i[1], i[2])], i[3], i[4], **_attrs(node, *keep))
    if t == "QLinearConcat":
        triples = [(i[k], i[k + 1], i[k + 2]) for k in range(2, len(node.input), 3)]
        return _float_op(node, "Concat", triples, i[0], i[1], **_attrs(node, "axis"))
    if t == "QGemm":
        return _qgemm(node, consts)
    return None


def _qgemm(node: onnx.NodeProto, consts: ConstantLookup) -> list[onnx.NodeProto]:
    """QGemm (A, a_scale, a_zero, B, b_scale, b_zero[, C, y_scale, y_zero]) as Gemm of the dequantized values:
    B per output column, the int32 C at a_scale * b_scale (a constant where both scales are), and a
    QuantizeLinear where y_scale is given (else the float result). ``qdq_to_qlinear`` then makes the group one
    QLinearMatMul with its bias where it can (alpha 1, A not transposed), whose integer sums and requantization
    are onnxruntime's."""
    i = list(node.input) + [""] * 9
    stem, out = node.name or node.output[0], node.output[0]
    attrs = _attrs(node, "alpha", "transA", "transB")
    nodes = [onnx.helper.make_node("DequantizeLinear", i[0:3], [f"{out}:dq0"], name=f"{stem}/dq0"),
             onnx.helper.make_node("DequantizeLinear", i[3:6], [f"{out}:dq1"], name=f"{stem}/dq1",
                                   axis=0 if attrs.get("transB", 0) else 1)]
    floats = [f"{out}:dq0", f"{out}:dq1"]
    if i[6]:
        scale = f"{out}:bias_scale"
        a_scale, b_scale = consts(i[1]), consts(i[4])
        if a_scale is not None and b_scale is not None:
            product = a_scale.astype(np.float32).reshape(-1) * b_scale.astype(np.float32).reshape(-1)
            if product.size == 1:   # per tensor: a scalar scale (a 1-D one is per axis, and must match it)
                product = product.reshape(())
            nodes.append(onnx.helper.make_node("Constant", [], [scale], name=f"{stem}/bias_scale",
                                               value=numpy_helper.from_array(product.astype(np.float32), scale)))
        else:
            nodes.append(onnx.helper.make_node("Mul", [i[1], i[4]], [scale], name=f"{stem}/bias_scale"))
        nodes.append(onnx.helper.make_node("DequantizeLinear", [i[6], scale], [f"{out}:dq2"], name=f"{stem}/dq2",
                                           axis=0))
        floats.append(f"{out}:dq2")
    result = f"{out}:float" if i[7] else out
    nodes.append(onnx.helper.make_node("Gemm", floats, [result], name=f"{stem}/Gemm", **attrs))
    if i[7]:
        nodes.append(onnx.helper.make_node("QuantizeLinear", [result, i[7], i[8]], [out], name=f"{stem}/q"))
    return nodes


def expand_contrib(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with onnxruntime's quantized contrib ops (``_contrib``) written as standard ops, so that a
    model quantized in the QOperator format imports (the model itself where it has none)."""
    if not any(n.domain == "com.microsoft" for n in model.graph.node):
        return model
    consts = ConstantLookup(model.graph)
    if not any(n.domain == "com.microsoft" and _contrib(n, consts) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for n in model.graph.node:
        expanded = _contrib(n, consts) if n.domain == "com.microsoft" else None
        out.graph.node.extend(expanded if expanded else [n])
    return out
