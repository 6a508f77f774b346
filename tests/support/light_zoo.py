"""The ONNX package's light model zoo (``onnx/backend/test/data/light``: ResNet-50, DenseNet-121, Inception v1
and v2, SqueezeNet, ShuffleNet, VGG-19, AlexNet, ZFNet-512 as the model zoo shipped them, opset 9, each weight
a ConstantOfShape of one value), and the same models with random weights: with every weight one constant, a
classifier's output is the same for every class, and a check against onnxruntime proves little."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

FOLDER = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")


def path(name: str) -> Path:
    return FOLDER / f"light_{name}.onnx"


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with each ConstantOfShape of a constant shape replaced by an initializer of random values:
    normal, scaled by 1/sqrt(fan-in) for weights of two or more dimensions (so activations stay in range), and
    positive for one-dimensional ones (batch normalisation's variances among them)."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    keep = []
    for node in g.node:
        shape = inits.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        if shape is None:
            keep.append(node)
            continue
        dims = [int(d) for d in shape.reshape(-1)]
        if len(dims) >= 2:
            value = rng.standard_normal(dims) / np.sqrt(max(1, int(np.prod(dims[1:]))))
        else:
            value = rng.uniform(0.5, 1.5, dims)
        g.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        if out.ir_version < 4:   # then every initializer is a graph input too (the converter insists)
            g.input.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, dims))
    del g.node[:]
    g.node.extend(keep)
    return out
