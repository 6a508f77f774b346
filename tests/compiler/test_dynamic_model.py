"""Models with open sizes (ONNX dim_param): one compile_model, runs at every sequence length and batch size,
checked against onnxruntime at each."""
from __future__ import annotations

import numpy as np
import pytest

import roller
from roller.compiler.dynamic_model import DynamicModel
from roller.errors import InputError
from tests.support.zoo_graphs import ALL, dynamic_attention_block, open_sizes, residual_block


@pytest.mark.slow
def test_bert_layer_with_an_open_sequence_length_runs_every_length() -> None:
    m = roller.compile_model(dynamic_attention_block(), hw="pocl-cpu", ranges={"seq": (1, 512)})
    assert isinstance(m, DynamicModel) and m.symbols == ("seq",)
    # The projections, the FFN and the layer norms lead with the length (a prefix of their grids serves);
    # attention's key transpose, scores, softmax and context take it as an argument, their values held in the
    # layout of the greatest length. Nothing is built at a new length.
    assert m.mode == "generic", m.why
    assert m.generic.greatest_layout and not m.generic.exact
    assert any(ks.scalar_args for ks in m.generic.sets.values())
    built = m.generic.kernels_compiled
    rng = np.random.default_rng(0)
    for seq in (1, 17, 128, 384, 5):
        feeds = {"x": rng.standard_normal((1, seq, 64)).astype(np.float32),
                 "mask": np.where(np.arange(seq) < seq * 3 // 4 + 1, 0.0, -10000.0).astype(np.float32)
                 .reshape(1, 1, 1, seq)}
        result = m.check(feeds)
        assert result["reference"].startswith("onnxruntime")
        assert m(**feeds).shape == (1, seq, 64)
    assert m.generic.kernels_compiled == built and m.generic.per_size_compiled == 0
    assert not m.models


def test_cnn_with_an_open_batch_is_built_once_for_every_batch() -> None:
    proto, inputs = residual_block()
    m = roller.compile_model(open_sizes(proto, {"x": {0: "n"}, "y": {0: "n"}}), hw="pocl-cpu",
                             ranges={"n": (1, 64)})
    assert isinstance(m, DynamicModel) and m.mode == "generic", m.why
    built = m.generic.kernels_compiled
    assert built >= 1
    for n in (1, 3, 64, 17):
        x = np.concatenate([inputs["x"]] * n) * np.float32(1.0 + 0.1 * n)
        assert m.check({"x": x})["reference"].startswith("onnxruntime")
        assert m(x).shape == (n, 16, 14, 14)
    assert m.generic.kernels_compiled == built   # no size compiled anything
    assert not m.models                          # nor built a model of its own


def test_cnn_with_an_open_batch_evaluated_chooses_every_set_on_the_device() -> None:
    """compile_model(evaluate=True) with an open size: each operator's kernel set is chosen by timing its
    shortlist at the sample sizes (every kept kernel timed somewhere), and the model runs correctly."""
    proto, inputs = residual_block()
    m = roller.compile_model(open_sizes(proto, {"x": {0: "n"}, "y": {0: "n"}}), hw="pocl-cpu",
                             ranges={"n": (1, 6)}, evaluate=True, progress=False)
    assert isinstance(m, DynamicModel) and m.mode == "generic", m.why
    sets = list(m.generic.sets.values())
    assert sets and all(ks.measured is not None for ks in sets)
    assert all(any(np.isfinite(t) for t in row) for ks in sets for row in ks.measured)
    built = m.generic.kernels_compiled
    for n in (1, 5):
        x = np.concatenate([inputs["x"]] * n)
        assert m.check({"x": x})["reference"].startswith("onnxruntime")
    assert m.generic.kernels_compiled == built


def test_cnn_per_size_when_asked() -> None:
    proto, inputs = residual_block()
    m = roller.compile_model(open_sizes(proto, {"x": {0: "n"}, "y": {0: "n"}}), hw="pocl-cpu", generic=False)
    assert m.mode == "per-size" and m.ranges == {"n": (1, 4096)}
    for n in (1, 3):
        assert m.check({"x": np.concatenate([inputs["x"]] * n)})["reference"].startswith("onnxruntime")
    assert sorted(m.models) == [(1,), (3,)]


def test_open_sizes_are_checked() -> None:
    m = roller.compile_model(dynamic_attention_block(), hw="pocl-cpu", ranges={"seq": (1, 32)})
    x = np.zeros((1, 8, 64), np.float32)
    with pytest.raises(InputError, match="'seq' is 8 in one input and 9"):
        m.run({"x": x, "mask": np.zeros((1, 1, 1, 9), np.float32)})
    with pytest.raises(InputError, match=r"outside its range \[1, 32\]"):
        m.run({"x": np.zeros((1, 40, 64), np.float32), "mask": np.zeros((1, 1, 1, 40), np.float32)})
    with pytest.raises(InputError, match="ranges names no open size"):
        roller.compile_model(dynamic_attention_block(), hw="pocl-cpu", ranges={"batch": (1, 8)})
    with pytest.raises(InputError, match="ranges.seq"):
        roller.compile_model(dynamic_attention_block(), hw="pocl-cpu", ranges={"seq": (0, 8)})
    assert not m.models   # nothing was built for a refused run


@pytest.mark.parametrize("builder", ["inverted_residual_block", "dense_block", "squeeze_excite", "grouped_conv",
                                     "pooling_zoo", "classifier_head"])
def test_zoo_blocks_with_an_open_batch(builder: str) -> None:
    """The zoo's CNN patterns (depthwise and grouped convolutions, concatenations, squeeze-excite's broadcast
    scale, pooling, a softmax head's row kernel) at three batches against onnxruntime, built once."""
    proto, inputs = ALL[builder]()
    (name, x), = inputs.items()
    out = proto.graph.output[0].name
    m = roller.compile_model(open_sizes(proto, {name: {0: "n"}, out: {0: "n"}}), hw="pocl-cpu",
                             ranges={"n": (1, 16)})
    assert m.mode == "generic", m.why
    for n in (1, 5, 16):
        assert m.check({name: np.concatenate([x] * n)})["ok"]
