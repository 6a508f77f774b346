"""Writes the example models of this folder (deterministic: seed 0), built with onnx.helper.

    .venv/bin/python examples/models/make_examples.py

``mini_resnet.onnx``: a small ResNet for 3x32x32 images: a 3x3 stem, two residual stages (the second strided,
with a 1x1 projection), BatchNormalization after every convolution (folded into it at import), global
average pooling, a fully connected layer and softmax over 10 classes. About 30k parameters.

``mini_bert.onnx``: a two-layer BERT encoder as ``torch.onnx.export`` writes Hugging Face's (hidden size 32, 4
heads, a vocabulary of 100, 16 tokens): int64 ``input_ids``, ``token_type_ids`` and ``attention_mask`` in,
``last_hidden_state`` out; built by ``tests/support/language_graphs.py``, which the tests use too.

``mini_gpt2.onnx`` and ``mini_gpt2_decoder.onnx``: a two-layer GPT-2 (hidden size 32, 4 heads, a vocabulary of 100,
64 positions), the same weights twice as Optimum exports a causal LM: without a cache, its length open
(``sequence``), and as the decoder with past key values (one token in, a cache of 31 positions: a context of 32;
``position_ids`` as an input). ``examples/generate.py`` generates with them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))   # the repository, for tests.support


class Builder:
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def weight(self, shape: tuple[int, ...], scale: float) -> str:
        n = self.name("w")
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), n))
        return n

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
        w = self.weight((cout, cin, k, k), (2.0 / (cin * k * k)) ** 0.5)
        c = self.name("conv")
        self.nodes.append(helper.make_node("Conv", [x, w], [c], name=c, kernel_shape=[k, k], strides=[stride] * 2,
                                           pads=[k // 2] * 4))
        beta = self.weight((cout,), 0.1)
        mean = self.weight((cout,), 0.1)
        var = self.name("var")
        self.inits.append(numpy_helper.from_array((self.rng.random(cout) + 0.5).astype(np.float32), var))
        bn = self.name("bn")
        scale = self.name("gamma")
        self.inits.append(numpy_helper.from_array((self.rng.random(cout) + 0.5).astype(np.float32), scale))
        self.nodes.append(helper.make_node("BatchNormalization", [c, scale, beta, mean, var], [bn], name=bn))
        if not relu:
            return bn
        r = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [bn], [r], name=r))
        return r

    def block(self, x: str, cin: int, cout: int, stride: int) -> str:
        y = self.conv_bn(x, cin, cout, 3, stride)
        y = self.conv_bn(y, cout, cout, 3, 1, relu=False)
        skip = x if stride == 1 and cin == cout else self.conv_bn(x, cin, cout, 1, stride, relu=False)
        a = self.name("add")
        self.nodes.append(helper.make_node("Add", [y, skip], [a], name=a))
        r = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [a], [r], name=r))
        return r


def mini_resnet() -> onnx.ModelProto:
    b = Builder(seed=0)
    x = b.conv_bn("image", 3, 16, 3)
    x = b.block(x, 16, 16, 1)
    x = b.block(x, 16, 32, 2)
    b.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
    b.nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], name="flatten"))
    fc, fcb = b.weight((10, 32), 0.2), b.weight((10,), 0.1)
    b.nodes.append(helper.make_node("Gemm", ["features", fc, fcb], ["logits"], name="fc", transB=1))
    b.nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1))
    graph = helper.make_graph(b.nodes, "mini_resnet",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 10])],
                              b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="roller-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    from tests.support.language_graphs import bert, gpt2

    small = {"vocab": 100, "layers": 2, "positions": 64}
    for name, model in (("mini_resnet", mini_resnet()), ("mini_bert", bert(vocab=100, seq=16, seed=0)),
                        ("mini_gpt2", gpt2(open_seq=True, past=0, **small)),
                        ("mini_gpt2_decoder", gpt2(seq=1, past=31, position_input=True, **small))):
        path = HERE / f"{name}.onnx"
        onnx.save(model, path)
        print(f"wrote {path}")
