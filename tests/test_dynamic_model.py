"""Models with open sizes (ONNX dim_param): one compile_model, runs at every sequence length and batch size,
checked against onnxruntime at each."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import roller
from roller.dynamic_model import DynamicModel
from roller.errors import InputError
from tests.zoo_graphs import attention_block, residual_block


def _open(proto: onnx.ModelProto, dims: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """``proto`` with the given input and output dimensions named instead of fixed."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for vi in [*out.graph.input, *out.graph.output]:
        for i, name in dims.get(vi.name, {}).items():
            vi.type.tensor_type.shape.dim[i].ClearField("dim_value")
            vi.type.tensor_type.shape.dim[i].dim_param = name
    return out


def _dynamic_attention() -> onnx.ModelProto:
    """The BERT layer of tests/zoo_graphs.py with its reshapes written as exporters write them for an open
    sequence length (0 keeps a dimension, -1 infers it), and the sequence length left open."""
    proto, _ = attention_block(hidden=64, heads=4, seq=16)
    for init in proto.graph.initializer:
        if init.data_type == onnx.TensorProto.INT64:
            v = numpy_helper.to_array(init)
            if v.tolist() in ([1, 16, 4, 16], [1, 16, 64]):
                init.CopyFrom(numpy_helper.from_array(np.array([0, -1, *v[2:]], np.int64), init.name))
    return _open(proto, {"x": {1: "seq"}, "mask": {3: "seq"}, "y": {1: "seq"}})


@pytest.mark.slow
def test_bert_layer_with_an_open_sequence_length_runs_every_length() -> None:
    m = roller.compile_model(_dynamic_attention(), hw="pocl-cpu", ranges={"seq": (1, 512)})
    assert isinstance(m, DynamicModel) and m.symbols == ("seq",)
    rng = np.random.default_rng(0)
    for seq in (1, 17, 128, 384):
        feeds = {"x": rng.standard_normal((1, seq, 64)).astype(np.float32),
                 "mask": np.where(np.arange(seq) < seq * 3 // 4 + 1, 0.0, -10000.0).astype(np.float32)
                 .reshape(1, 1, 1, seq)}
        result = m.check(feeds)
        assert result["reference"].startswith("onnxruntime")
        assert m(**feeds).shape == (1, seq, 64)
    assert len(m.models) == 4


def test_cnn_with_an_open_batch_runs_every_batch() -> None:
    proto, inputs = residual_block()
    m = roller.compile_model(_open(proto, {"x": {0: "n"}, "y": {0: "n"}}), hw="pocl-cpu")
    assert isinstance(m, DynamicModel) and m.ranges == {"n": (1, 4096)}
    for n in (1, 3):
        x = np.concatenate([inputs["x"]] * n)
        assert m.check({"x": x})["reference"].startswith("onnxruntime")
    assert sorted(m.models) == [(1,), (3,)]


def test_open_sizes_are_checked() -> None:
    m = roller.compile_model(_dynamic_attention(), hw="pocl-cpu", ranges={"seq": (1, 32)})
    x = np.zeros((1, 8, 64), np.float32)
    with pytest.raises(InputError, match="'seq' is 8 in one input and 9"):
        m.run({"x": x, "mask": np.zeros((1, 1, 1, 9), np.float32)})
    with pytest.raises(InputError, match=r"outside its range \[1, 32\]"):
        m.run({"x": np.zeros((1, 40, 64), np.float32), "mask": np.zeros((1, 1, 1, 40), np.float32)})
    with pytest.raises(InputError, match="ranges names no open size"):
        roller.compile_model(_dynamic_attention(), hw="pocl-cpu", ranges={"batch": (1, 8)})
    with pytest.raises(InputError, match="ranges.seq"):
        roller.compile_model(_dynamic_attention(), hw="pocl-cpu", ranges={"seq": (0, 8)})
    assert not m.models   # nothing was built for a refused run
