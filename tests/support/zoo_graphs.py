"""Small ONNX graphs with the patterns of the model zoo (``bench/zoo``), for the importer's and the executor's
tests: each builder returns ``(model, inputs)``, an opset-17 model made with ``onnx.helper`` alone (no torch) and
the inputs to run it on. Weights and inputs are numpy random numbers from a fixed seed, so a builder returns the
same bytes every time; each graph runs in a few milliseconds in onnxruntime.

Every graph output carries its full static shape, so a test can compare an executor's output shapes with the
declared ones. ``ALL`` maps each builder's name to the builder.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8   # the IR of opset 17: older onnxruntime releases (1.18 and on) load it too

Graph = tuple[onnx.ModelProto, dict[str, np.ndarray]]


class _Builder:
    """Collects nodes and initializers with generated names, and random weights from one seeded generator."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, value: np.ndarray | float | Sequence[int], stem: str = "c",
              dtype: type = np.float32) -> str:
        arr: np.ndarray = np.asarray(value, dtype=dtype)
        name = self._fresh(stem)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, value: Sequence[int] | int, stem: str = "shape") -> str:
        return self.const(value, stem, np.int64)

    def normal(self, shape: Sequence[int], std: float, stem: str = "w") -> str:
        return self.const(self.rng.normal(0.0, std, shape), stem)

    def uniform(self, shape: Sequence[int], low: float, high: float, stem: str = "b") -> str:
        return self.const(self.rng.uniform(low, high, shape), stem)

    def node(self, op: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1, **attrs: Any) -> str:
        """Add a node; return its (first) output's name."""
        names = [self._fresh(op.lower()) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        self.nodes.append(helper.make_node(op, list(inputs), names, name=self._fresh(op), **attrs))
        return names[0]

    def outs(self, op: str, inputs: Sequence[str], n: int, **attrs: Any) -> list[str]:
        names = [self._fresh(op.lower()) for _ in range(n)]
        self.node(op, inputs, names, **attrs)
        return names

    # -- layers made of several nodes ----------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int, bias: bool = True, group: int = 1,
             **attrs: Any) -> str:
        """He-normal weights on fan-in, so activations stay of order one through a few layers."""
        w = self.normal((cout, cin // group, k, k), math.sqrt(2.0 / (cin // group * k * k)))
        ins = [x, w] + ([self.uniform((cout,), -0.1, 0.1)] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], group=group, **attrs)

    def batchnorm(self, x: str, c: int) -> str:
        """Scale, shift and running statistics well away from 1 and 0: a wrong epsilon, swapped mean and
        variance or a dropped affine step changes the output."""
        return self.node("BatchNormalization", [
            x, self.uniform((c,), 0.5, 1.5, "gamma"), self.uniform((c,), -0.2, 0.2, "beta"),
            self.const(self.rng.normal(0.0, 0.2, (c,)), "mean"), self.uniform((c,), 0.5, 2.0, "var")],
            epsilon=1e-5)

    def linear(self, x: str, cin: int, cout: int) -> str:
        """MatMul then Add of the bias, as exporters write nn.Linear on a 3-D input."""
        y = self.node("MatMul", [x, self.normal((cin, cout), 1.0 / math.sqrt(cin))])
        return self.node("Add", [y, self.uniform((cout,), -0.1, 0.1)])

    def layernorm(self, x: str, c: int, out: str | None = None) -> str:
        return self.node("LayerNormalization", [x, self.uniform((c,), 0.5, 1.5, "gamma"),
                                                self.uniform((c,), -0.1, 0.1, "beta")],
                         1 if out is None else [out], axis=-1, epsilon=1e-12)

    def model(self, inputs: dict[str, np.ndarray], outputs: dict[str, Sequence[int]]) -> Graph:
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
            initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="roller tests/zoo_graphs.py")
        return m, inputs

    def image(self, shape: Sequence[int]) -> np.ndarray:
        return self.rng.standard_normal(tuple(shape), dtype=np.float32)


def residual_block() -> Graph:
    """ResNet's basic block: Conv -> BN -> Relu -> Conv -> BN -> Add(skip) -> Relu, 16 channels, 14x14."""
    b = _Builder("residual_block")
    x = b.image((1, 16, 14, 14))
    h = b.node("Relu", [b.batchnorm(b.conv("x", 16, 16, 3, pads=[1, 1, 1, 1]), 16)])
    h = b.batchnorm(b.conv(h, 16, 16, 3, pads=[1, 1, 1, 1]), 16)
    b.node("Relu", [b.node("Add", [h, "x"])], ["y"])
    return b.model({"x": x}, {"y": x.shape})


def inverted_residual_block() -> Graph:
    """MobileNetV2's block with expansion 6: 1x1 Conv -> BN -> Clip(0, 6) -> depthwise 3x3 -> BN -> Clip ->
    1x1 Conv -> BN -> Add(skip). The Clip bounds are inputs (opset 11 on), as exporters write ReLU6."""
    b = _Builder("inverted_residual_block")
    x = b.image((1, 16, 14, 14))
    lo, hi = b.const(0.0, "min"), b.const(6.0, "max")
    h = b.node("Clip", [b.batchnorm(b.conv("x", 16, 96, 1, bias=False), 96), lo, hi])
    h = b.conv(h, 96, 96, 3, bias=False, group=96, strides=[1, 1], pads=[1, 1, 1, 1])
    h = b.node("Clip", [b.batchnorm(h, 96), lo, hi])
    h = b.batchnorm(b.conv(h, 96, 16, 1, bias=False), 16)
    b.node("Add", ["x", h], ["y"])
    return b.model({"x": x}, {"y": x.shape})


def attention_block(hidden: int = 64, heads: int = 4, seq: int = 16) -> Graph:
    """A BERT encoder layer at small size, node for node as torch exports Hugging Face's BertLayer: Q/K/V
    MatMul+Add, heads split by Reshape and Transpose (K transposed straight to [b, h, d, s]), scores divided by
    sqrt(d), the additive mask, Softmax, context MatMul, heads merged, output MatMul+Add, residual Add and
    LayerNormalization; then the FFN with GELU in its erf form and a second residual and LayerNormalization."""
    b = _Builder("attention_block")
    d = hidden // heads
    x = b.rng.standard_normal((1, seq, hidden), dtype=np.float32)
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., seq * 3 // 4:] = -10000.0          # the last quarter is padding
    split = b.ints([1, seq, heads, d])

    def heads_of(perm: list[int]) -> str:
        return b.node("Transpose", [b.node("Reshape", [b.linear("x", hidden, hidden), split])], perm=perm)

    q, k, v = heads_of([0, 2, 1, 3]), heads_of([0, 2, 3, 1]), heads_of([0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.const(math.sqrt(d))])
    probs = b.node("Softmax", [b.node("Add", [scores, "mask"])], axis=-1)
    ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.ints([1, seq, hidden])])
    attended = b.layernorm(b.node("Add", [b.linear(ctx, hidden, hidden), "x"]), hidden)
    inner = b.linear(attended, hidden, 4 * hidden)
    erf = b.node("Erf", [b.node("Div", [inner, b.const(math.sqrt(2.0))])])
    gelu = b.node("Mul", [b.node("Mul", [inner, b.node("Add", [erf, b.const(1.0)])]), b.const(0.5)])
    b.layernorm(b.node("Add", [b.linear(gelu, 4 * hidden, hidden), attended]), hidden, "y")
    return b.model({"x": x, "mask": mask}, {"y": x.shape})


def dense_block(cin: int = 16, growth: int = 8, layers: int = 3, bn_size: int = 4) -> Graph:
    """DenseNet: pre-activation layers (BN -> Relu -> 1x1 Conv -> BN -> Relu -> 3x3 Conv), each output
    concatenated to its input along channels, then a transition (BN, Relu, 1x1 Conv halving the channels,
    AveragePool 2x2 stride 2). 8x8 in, 4x4 out."""
    b = _Builder("dense_block")
    x = b.image((1, cin, 8, 8))
    h, c = "x", cin
    for _ in range(layers):
        t = b.conv(b.node("Relu", [b.batchnorm(h, c)]), c, bn_size * growth, 1, bias=False)
        t = b.conv(b.node("Relu", [b.batchnorm(t, bn_size * growth)]), bn_size * growth, growth, 3, bias=False,
                   pads=[1, 1, 1, 1])
        h, c = b.node("Concat", [h, t], axis=1), c + growth
    t = b.conv(b.node("Relu", [b.batchnorm(h, c)]), c, c // 2, 1, bias=False)
    b.node("AveragePool", [t], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    return b.model({"x": x}, {"y": (1, c // 2, 4, 4)})


def classifier_head(c: int = 32, classes: int = 10) -> Graph:
    """GlobalAveragePool -> Flatten -> Gemm (weights [classes, c], transB=1, as nn.Linear exports) -> Softmax."""
    b = _Builder("classifier_head")
    x = b.image((1, c, 7, 7))
    flat = b.node("Flatten", [b.node("GlobalAveragePool", ["x"])], axis=1)
    logits = b.node("Gemm", [flat, b.normal((classes, c), 1.0 / math.sqrt(c)), b.uniform((classes,), -0.1, 0.1)],
                    transB=1)
    b.node("Softmax", [logits], ["y"], axis=1)
    return b.model({"x": x}, {"y": (1, classes)})


def pooling_zoo() -> Graph:
    """Four poolings of one 14x14 input, kernel 3, stride 2, pads 1: MaxPool with ceil_mode 0 (7x7) and 1
    (8x8: an even size is where the two differ), AveragePool with count_include_pad 0 and 1 (they differ
    along the padded border)."""
    b = _Builder("pooling_zoo")
    x = b.image((1, 4, 14, 14))
    common = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    b.node("MaxPool", ["x"], ["max_floor"], ceil_mode=0, **common)
    b.node("MaxPool", ["x"], ["max_ceil"], ceil_mode=1, **common)
    b.node("AveragePool", ["x"], ["avg_exclude_pad"], count_include_pad=0, **common)
    b.node("AveragePool", ["x"], ["avg_include_pad"], count_include_pad=1, **common)
    return b.model({"x": x}, {"max_floor": (1, 4, 7, 7), "max_ceil": (1, 4, 8, 8),
                              "avg_exclude_pad": (1, 4, 7, 7), "avg_include_pad": (1, 4, 7, 7)})


def shape_arithmetic() -> Graph:
    """What exporters write for ``x.view(x.size(0), -1)``: Shape -> Gather -> Unsqueeze -> Concat(with -1) ->
    Reshape; then ``* 3 + 0.5`` with the 3 a Cast of an int64 Constant node and the 0.5 a ConstantOfShape. All of
    the shape side is constant for fixed input shapes, which is what the importer's folding has to see.
    y = x.reshape(2, -1) * 3 + 0.5."""
    b = _Builder("shape_arithmetic")
    x = b.image((2, 3, 4, 5))
    batch = b.node("Gather", [b.node("Shape", ["x"]), b.ints(0, "index")], axis=0)
    minus_one = b.node("Constant", [], value=numpy_helper.from_array(np.array([-1], np.int64)))
    target = b.node("Concat", [b.node("Unsqueeze", [batch, b.ints([0], "axes")]), minus_one], axis=0)
    flat = b.node("Reshape", ["x", target])
    three = b.node("Cast", [b.node("Constant", [], value_int=3)], to=TensorProto.FLOAT)
    half = b.node("ConstantOfShape", [b.ints([1, 60])],
                  value=numpy_helper.from_array(np.array([0.5], np.float32)))
    b.node("Add", [b.node("Mul", [flat, three]), half], ["y"])
    return b.model({"x": x}, {"y": (2, 60)})


def squeeze_excite(c: int = 32, reduced: int = 8) -> Graph:
    """Squeeze-and-excitation: GlobalAveragePool -> 1x1 Conv -> Relu -> 1x1 Conv -> Sigmoid, the gate
    multiplied into the input by broadcasting ([1, c, 1, 1] against [1, c, 8, 8])."""
    b = _Builder("squeeze_excite")
    x = b.image((1, c, 8, 8))
    s = b.node("Relu", [b.conv(b.node("GlobalAveragePool", ["x"]), c, reduced, 1)])
    gate = b.node("Sigmoid", [b.conv(s, reduced, c, 1)])
    b.node("Mul", ["x", gate], ["y"])
    return b.model({"x": x}, {"y": x.shape})


def channel_shuffle(c: int = 16, groups: int = 2) -> Graph:
    """ShuffleNetV2's stride-1 unit in miniature: Split the channels in two, a 1x1 Conv + Relu on the second
    half, Concat, then the shuffle: Reshape to [b, groups, c/groups, h, w] -> Transpose(1, 2) -> Reshape back."""
    b = _Builder("channel_shuffle")
    x = b.image((1, c, 8, 8))
    half = c // 2
    left, right = b.outs("Split", ["x", b.ints([half, half], "split")], 2, axis=1)
    right = b.node("Relu", [b.conv(right, half, half, 1)])
    h = b.node("Reshape", [b.node("Concat", [left, right], axis=1), b.ints([1, groups, c // groups, 8, 8])])
    h = b.node("Transpose", [h], perm=[0, 2, 1, 3, 4])
    b.node("Reshape", [h, b.ints([1, c, 8, 8])], ["y"])
    return b.model({"x": x}, {"y": x.shape})


def chunk_slices(c: int = 6) -> Graph:
    """``x.chunk(2, dim=1)`` as torch's TorchScript exporter writes it in ShuffleNetV2: Shape -> Gather([1]) ->
    Add 1 -> Div 2 -> Mul 1 and Mul 2, all int64 (so Div truncates: (6 + 1) / 2 is 3), giving the bounds of two
    Slices along axis 1; the halves are concatenated in swapped order so the output shows where each went."""
    b = _Builder("chunk_slices")
    x = b.image((1, c, 4, 4))
    axis = b.ints([1], "axis")
    size = b.node("Gather", [b.node("Shape", ["x"]), axis], axis=0)
    step = b.node("Div", [b.node("Add", [size, b.ints([1], "one")]), b.ints([2], "two")])
    mid, end = b.node("Mul", [step, b.ints([1], "one")]), b.node("Mul", [step, b.ints([2], "two")])
    first = b.node("Slice", ["x", b.ints([0], "zero"), mid, axis])
    second = b.node("Slice", ["x", mid, end, axis])
    b.node("Concat", [second, first], ["y"], axis=1)
    return b.model({"x": x}, {"y": x.shape})


def grouped_conv() -> Graph:
    """Convolution attributes in combination: group 4, dilations 2, strides 2 and asymmetric explicit pads
    (top 1, left 2, bottom 2, right 1) take 17x17 to 8x8; then an auto_pad SAME_UPPER conv with stride 2 takes
    8x8 to 4x4 (one row and column of padding, all at the end). Both results are outputs."""
    b = _Builder("grouped_conv")
    x = b.image((1, 8, 17, 17))
    b.node("Conv", ["x", b.normal((16, 2, 3, 3), math.sqrt(2.0 / 18)), b.uniform((16,), -0.1, 0.1)], ["y1"],
           kernel_shape=[3, 3], group=4, dilations=[2, 2], strides=[2, 2], pads=[1, 2, 2, 1])
    b.node("Conv", ["y1", b.normal((16, 16, 3, 3), math.sqrt(2.0 / 144))], ["y2"],
           kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
    return b.model({"x": x}, {"y1": (1, 16, 8, 8), "y2": (1, 16, 4, 4)})


def layernorm_decomposed(hidden: int = 32) -> Graph:
    """LayerNormalization as exporters wrote it before opset 17 (and as many published BERT files still have
    it): ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta, over the last axis."""
    b = _Builder("layernorm_decomposed")
    x = b.rng.standard_normal((1, 8, hidden), dtype=np.float32)
    centred = b.node("Sub", ["x", b.node("ReduceMean", ["x"], axes=[-1], keepdims=1)])
    var = b.node("ReduceMean", [b.node("Pow", [centred, b.const(2.0)])], axes=[-1], keepdims=1)
    norm = b.node("Div", [centred, b.node("Sqrt", [b.node("Add", [var, b.const(1e-12)])])])
    scaled = b.node("Mul", [norm, b.uniform((hidden,), 0.5, 1.5, "gamma")])
    b.node("Add", [scaled, b.uniform((hidden,), -0.1, 0.1, "beta")], ["y"])
    return b.model({"x": x}, {"y": x.shape})


def open_sizes(proto: onnx.ModelProto, dims: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """A copy of ``proto`` with the given input and output dimensions named (``dim_param``) instead of fixed."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for vi in [*out.graph.input, *out.graph.output]:
        for i, name in dims.get(vi.name, {}).items():
            vi.type.tensor_type.shape.dim[i].ClearField("dim_value")
            vi.type.tensor_type.shape.dim[i].dim_param = name
    return out


def dynamic_attention_block(hidden: int = 64, heads: int = 4) -> onnx.ModelProto:
    """``attention_block`` with an open sequence length ``seq`` (inputs x [1, seq, hidden] and mask
    [1, 1, 1, seq]), its reshapes written as exporters write them then (0 keeps a dimension, -1 infers it)."""
    seq = 16
    proto, _ = attention_block(hidden=hidden, heads=heads, seq=seq)
    for init in proto.graph.initializer:
        if init.data_type == TensorProto.INT64:
            v = numpy_helper.to_array(init)
            if v.tolist() in ([1, seq, heads, hidden // heads], [1, seq, hidden]):
                init.CopyFrom(numpy_helper.from_array(np.array([0, -1, *v[2:]], np.int64), init.name))
    return open_sizes(proto, {"x": {1: "seq"}, "mask": {3: "seq"}, "y": {1: "seq"}})


ALL: dict[str, Callable[[], Graph]] = {f.__name__: f for f in [
    residual_block, inverted_residual_block, attention_block, dense_block, classifier_head, pooling_zoo,
    shape_arithmetic, squeeze_excite, channel_shuffle, chunk_slices, grouped_conv, layernorm_decomposed]}
