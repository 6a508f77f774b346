"""ONNX translations against onnxruntime where ONNX's node tests leave a form out (or run it only in float64),
the ONNX backend's run-time specialisation, and the refusals of what is not supported."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

import roller.compiler.onnx_backend as backend
from roller.backends import get
from roller.errors import InputError
from roller.frontends.onnx import import_model

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
F = TensorProto.FLOAT


def node_model(op: str, inputs: dict[str, tuple[int, list[int]]], outputs: list[str], opset: int = 21,
               inits: dict[str, np.ndarray] | None = None, out_rank: int | None = None,
               **attrs: Any) -> onnx.ModelProto:
    """A one-node model named after its op: ``inputs`` name -> (element type, shape); initializers by name
    (the node's inputs after the graph inputs, in ``inits`` order); the outputs' shapes inferred, or of rank
    ``out_rank`` with open sizes where they cannot be."""
    inits = inits or {}
    node = helper.make_node(op, [*inputs, *inits], outputs, name=f"the_{op.lower()}", **attrs)
    outs = [helper.make_empty_tensor_value_info(o) if out_rank is None else
            helper.make_tensor_value_info(o, F, [None] * out_rank) for o in outputs]
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info(n, t, s) for n, (t, s) in
                                                   inputs.items()], outs,
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got = backend.run_model(model, feeds)
    for g, r in zip(got, onnxruntime(model, feeds)):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- forms the node tests leave out ------------------------------------------------------------------------------

@needs_device
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_average_pool_same_padding_counts_the_end_padding(auto_pad: str) -> None:
    # The end padding of auto_pad SAME was taken as 0, so windows across the end averaged over too few points.
    model = node_model("AveragePool", {"x": (F, [1, 2, 7, 6])}, ["y"], kernel_shape=[3, 4], strides=[2, 2],
                       auto_pad=auto_pad, count_include_pad=1)
    check(model, {"x": rand(1, 2, 7, 6)})


@needs_device
@pytest.mark.parametrize("exponent", [0.0, 5.0, -3.0, 0.5, 1.5])
def test_pow_of_negative_and_infinite_bases(exponent: float) -> None:
    # Integer exponents above 4 went through exp(e log x): NaN for every negative base.
    x = np.array([[-2.0, -1.5, 0.0, 0.5, 3.0, np.inf]], np.float32)
    model = node_model("Pow", {"x": (F, [1, 6])}, ["y"], inits={"e": np.array(exponent, np.float32)})
    check(model, {"x": x})


@needs_device
@pytest.mark.parametrize("pads", [[0, 0, 0, 2], [0, 1, 0, 0], [0, -1, 0, 2], [1, 0, -1, 0]])
def test_pad_at_one_end_only(pads: list[int]) -> None:
    # Padding (or cropping) an axis at its end only once failed to build: its index was the plain axis.
    model = node_model("Pad", {"x": (F, [3, 4])}, ["y"], opset=18,
                       inits={"pads": np.array(pads, np.int64), "value": np.array(1.5, np.float32)})
    check(model, {"x": rand(3, 4)})


@needs_device
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_log_sum_exp_in_float32_with_an_infinite_element(keepdims: int) -> None:
    # The node tests run ReduceLogSumExp in float64 only.
    x = rand(2, 3, 4) * 30
    x[1, 2, 0] = np.inf
    model = node_model("ReduceLogSumExp", {"x": (F, [2, 3, 4])}, ["y"], opset=18,
                       inits={"axes": np.array([-1], np.int64)}, keepdims=keepdims)
    check(model, {"x": x})


@needs_device
@pytest.mark.parametrize("op", ["ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceMean"])
def test_reduce_with_no_axes_and_noop_keeps_the_element_term(op: str) -> None:
    # noop_with_empty_axes returned the input unchanged; ONNX squares it for ReduceSumSquare (and so on).
    model = node_model(op, {"x": (F, [2, 3])}, ["y"], opset=18, noop_with_empty_axes=1)
    check(model, {"x": np.abs(rand(2, 3)) + 0.1})


@needs_device
def test_clip_with_computed_bounds_and_min_above_max() -> None:
    model = node_model("Clip", {"x": (F, [2, 5]), "lo": (F, []), "hi": (F, [])}, ["y"])
    x = rand(2, 5)
    check(model, {"x": x, "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)})
    # every element is max when min > max (the bounds were once applied in the other order: min)
    check(model, {"x": x, "lo": np.array(1.0, np.float32), "hi": np.array(-1.0, np.float32)})


CONV_TRANSPOSE = [  # (input spatial, kernel, attributes)
    ([5], [3], {"strides": [2]}),
    ([4, 5], [3, 2], {"strides": [3, 2], "dilations": [1, 2], "pads": [1, 0, 2, 1]}),
    ([4, 4], [4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}),
    ([3, 5], [2, 3], {"strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    ([3, 5], [2, 3], {"strides": [2, 1], "auto_pad": "SAME_LOWER"}),
    ([6], [5], {"strides": [4], "dilations": [3]}),
]


@needs_device
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), CONV_TRANSPOSE)
@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_phases(spatial: list[int], kernel: list[int], attrs: dict[str, Any], group: int) -> None:
    c, f = 4, 3
    w = rand(c, f, *kernel, seed=1)
    b = rand(f * group, seed=2)
    model = node_model("ConvTranspose", {"x": (F, [2, c, *spatial])}, ["y"], inits={"w": w, "b": b},
                       group=group, **attrs)
    check(model, {"x": rand(2, c, *spatial)}, rtol=1e-4, atol=1e-5)


@needs_device
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_gather_elements_of_constants_longer_than_their_indices(axis: int) -> None:
    # PyTorch's exporter writes BERT's token type ids as GatherElements of a [1, 512] buffer at [1, 32]
    # positions; ONNX's reference implementation, which folds constants at import, failed on it.
    data = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)
    idx = np.array([[0, -1, 3], [8, 2, 2]], np.int64) if axis != 0 else np.array([[1, 0, 1]], np.int64)
    gather = helper.make_node("GatherElements", ["data", "idx"], ["g"], axis=axis)
    add = helper.make_node("Add", ["g", "x"], ["y"])
    shape = list(idx.shape)
    graph = helper.make_graph([gather, add], "g", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, shape)],
                              [numpy_helper.from_array(data, "data"), numpy_helper.from_array(idx, "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rand(*shape)
    want = np.take_along_axis(data[:, :3] if axis == 0 else data, np.where(idx < 0, idx + 9, idx), axis=axis) + x
    check(model, {"x": x})
    np.testing.assert_allclose(backend.run_model(model, {"x": x})[0], want)


POINTWISE = [  # (spatial, attrs, weight a graph input): the forms a 1x1 convolution takes in exported models
    ([7, 7], {}, False), ([9, 6], {"strides": [2, 2]}, False), ([5, 5], {"dilations": [3, 3]}, True),
    ([11], {}, False), ([3, 4, 5], {"strides": [1, 2, 1]}, True),
    ([6, 6], {"pads": [1, 0, 0, 1]}, False),   # a padded 1x1 keeps its window (its border is zeros)
]


@needs_device
@pytest.mark.parametrize(("spatial", "attrs", "weight_input"), POINTWISE)
def test_pointwise_convolutions(spatial: list[int], attrs: dict[str, Any], weight_input: bool) -> None:
    c, f = 5, 6
    w = rand(f, c, *[1] * len(spatial), seed=1)
    inputs = {"x": (F, [2, c, *spatial])} | ({"w": (F, list(w.shape))} if weight_input else {})
    model = node_model("Conv", inputs, ["y"], inits={} if weight_input else {"w": w}, **attrs)
    check(model, {"x": rand(2, c, *spatial)} | ({"w": w} if weight_input else {}), rtol=1e-4, atol=1e-5)


def test_a_pointwise_convolution_is_a_matmul_over_its_positions() -> None:
    # Its unit window axes dropped, a 1x1 convolution's positions are one axis after axis fusion on a CPU: a
    # matmul of weights by positions. With them, X's index h+r kept H and W apart (7x7 positions tiled as
    # 8x8, rows of 7: 22-40 GFLOP/s where the matmul ran 130 on PoCL).
    from roller.construction import prepared
    from roller.hw import load
    model = node_model("Conv", {"x": (F, [1, 160, 7, 7])}, ["y"], inits={"w": rand(960, 160, 1, 1)})
    (node,) = [n for n in import_model(model).nodes if hasattr(n, "expr")]
    assert [a.name for a in node.expr.reduce_axes] == ["c"]
    form = prepared(node.expr, load("pocl-cpu"))
    assert sorted(a.extent for a in form.spatial_axes if a.extent > 1) == [49, 960]


@needs_device
@pytest.mark.parametrize(("mode", "transform"), list(itertools.product(
    ["round_prefer_floor", "floor", "ceil"], ["half_pixel", "asymmetric", "align_corners"])))
def test_resize_nearest_to_odd_sizes(mode: str, transform: str) -> None:
    model = node_model("Resize", {"x": (F, [1, 2, 5, 4])}, ["y"], opset=19,
                       inits={"roi": np.array([], np.float32), "scales": np.array([], np.float32),
                              "sizes": np.array([1, 2, 7, 10], np.int64)},
                       mode="nearest", nearest_mode=mode, coordinate_transformation_mode=transform)
    check(model, {"x": rand(1, 2, 5, 4)})


# -- the backend: run-time specialisation ----------------------------------------------------------------------

@needs_device
def test_integer_inputs_are_specialised_per_value() -> None:
    model = node_model("ReduceSum", {"x": (F, [2, 3, 4]), "axes": (TensorProto.INT64, [1])}, ["y"], keepdims=0,
                       out_rank=2)
    rep = backend.prepare(model)
    x = rand(2, 3, 4)
    for axis in (1, 2, 1):
        got = rep.run([x, np.array([axis], np.int64)])[0]
        np.testing.assert_allclose(got, x.sum(axis=axis), rtol=1e-5, atol=1e-6)
    assert rep.specialised_inputs == ["axes"] and len(rep._compiled) == 2


@needs_device
def test_float_inputs_needed_as_constants_are_specialised() -> None:
    model = node_model("Pad", {"x": (F, [2, 2]), "pads": (TensorProto.INT64, [4]), "v": (F, [])}, ["y"],
                       out_rank=2)
    rep = backend.prepare(model)
    feeds = {"x": rand(2, 2), "pads": np.array([1, 0, 0, 1], np.int64), "v": np.array(7.0, np.float32)}
    np.testing.assert_array_equal(rep.run(feeds)[0], onnxruntime(model, feeds)[0])
    assert rep.specialised_inputs == ["pads", "v"]
    model = node_model("Pad", {"x": (F, [2, 2]), "v": (F, [])}, ["y"], inits={"pads": np.array([1, 0, 0, 1])})
    model.graph.node[0].input[:] = ["x", "pads", "v"]
    np.testing.assert_array_equal(backend.run_model(model, {"x": feeds["x"], "v": feeds["v"]})[0],
                                  onnxruntime(model, {"x": feeds["x"], "v": feeds["v"]})[0])
    with pytest.raises(InputError, match=r"input 2 \(constant_value\) must be a constant known at import; "
                                         r"here it is an input"):
        backend.prepare(model, specialize=False)


def test_the_backend_refuses_types_it_does_not_render() -> None:
    # A bfloat16 buffer was once read as float by the OpenCL kernels: garbage, silently. HIP has no bfloat16.
    model = node_model("Relu", {"x": (TensorProto.BFLOAT16, [4])}, ["y"])
    with pytest.raises(InputError, match="computes bfloat16 tensors .* the hip backend renders float64, float32, "
                                         "float16, int64, int32, int8, uint8, bool only"):
        backend.prepare(model, hw="mi50", backend="hip")


# -- refusals name what is not supported --------------------------------------------------------------------------

REFUSED = [
    ("Pad", {"x": (F, [3, 4])}, {"pads": np.array([1, 1, 1, 1], np.int64)}, {"mode": "reflect"},
     r"mode='reflect' is not supported \(constant\)"),
    ("Resize", {"x": (F, [1, 1, 2, 2])}, {"roi": np.array([], np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
     {"mode": "area"}, r"mode='area' is not supported \(nearest, linear, cubic\)"),
    ("Pow", {"x": (TensorProto.BOOL, [3])}, {"e": np.array([1, 2, 3], np.int64)}, {},
     r"Pow of a bool base by an exponent per element is not supported"),
    ("Pow", {"x": (F, [3])}, {"e": np.array(17, np.float32)}, {}, r"the integer exponent 17 is not supported"),
    ("Dropout", {"x": (F, [3])}, {"r": np.array(0.5, np.float32), "t": np.array(True)}, {},
     r"training_mode=true with ratio 0.5 draws a random mask"),
    ("LpPool", {"x": (F, [1, 1, 4, 4])}, {}, {"kernel_shape": [2, 2], "p": 0}, r"p=0 is not supported"),
    ("Gelu", {"x": (F, [3])}, {}, {"approximate": "erf"}, r"approximate='erf' is not supported"),
    ("GroupNormalization", {"x": (F, [1, 4, 2])}, {"s": np.ones(4, np.float32), "b": np.zeros(4, np.float32)},
     {"num_groups": 2, "stash_type": 0, "out_rank": 3}, r"stash_type other than 1"),
]


@pytest.mark.parametrize(("op", "inputs", "inits", "attrs", "message"), REFUSED)
def test_unsupported_forms_are_refused_by_name(op: str, inputs: dict, inits: dict, attrs: dict, message: str) -> None:
    model = node_model(op, inputs, ["y"], inits=inits, **attrs)
    with pytest.raises(InputError, match=message) as err:
        import_model(model)
    assert f"node 'the_{op.lower()}' ({op})" in str(err.value)


# -- older opsets: the attribute forms the node tests (at each op's newest version) leave out -------------------

I64 = TensorProto.INT64
OLD_FORMS = [  # (op, opset, inputs, initializers, attributes, out_rank)
    ("Softmax", 11, {"x": (F, [2, 3, 4])}, {}, {"axis": 1}, None),          # flattens [1:] into one row
    ("LogSoftmax", 12, {"x": (F, [2, 3, 4])}, {}, {}, None),                # default axis 1, flattened
    ("Softmax", 13, {"x": (F, [2, 3, 4])}, {}, {"axis": 1}, None),          # one axis
    ("Split", 11, {"x": (F, [2, 6])}, {}, {"axis": 1, "split": [2, 4]}, None),
    ("Squeeze", 11, {"x": (F, [2, 1, 3, 1])}, {}, {"axes": [-1, 1]}, None),
    ("Unsqueeze", 11, {"x": (F, [2, 3])}, {}, {"axes": [0, -1]}, None),
    ("ReduceSum", 11, {"x": (F, [2, 3, 4])}, {}, {"axes": [0, -1], "keepdims": 0}, None),
    ("ReduceMean", 17, {"x": (F, [2, 3, 4])}, {}, {"axes": [1]}, None),
    ("Clip", 11, {"x": (F, [2, 5])}, {"lo": np.array(-0.3, np.float32)}, {}, None),
    ("Pad", 11, {"x": (F, [2, 3])}, {"pads": np.array([0, 1, 2, 0], np.int64)}, {}, None),
    ("Dropout", 11, {"x": (F, [2, 3])}, {}, {"ratio": 0.3}, None),
    ("Resize", 11, {"x": (F, [1, 1, 3, 3])}, {"roi": np.array([], np.float32),
                                               "scales": np.array([1, 1, 2, 3], np.float32)},
     {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, None),
    ("Resize", 13, {"x": (F, [1, 1, 3, 4])}, {"roi": np.array([], np.float32),
                                               "scales": np.array([1, 1, 0.6, 0.5], np.float32)},
     {"mode": "nearest", "nearest_mode": "ceil"}, None),
    ("Gemm", 11, {"a": (F, [4, 3]), "b": (F, [5, 4])}, {"c": np.arange(5, dtype=np.float32)},
     {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, None),
    ("AveragePool", 11, {"x": (F, [1, 2, 6, 7])}, {}, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1,
                                                        "pads": [1, 0, 1, 1], "count_include_pad": 1}, None),
    ("MaxPool", 12, {"x": (F, [1, 2, 7, 7])}, {}, {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1,
                                                    "strides": [2, 2]}, None),
    ("Conv", 11, {"x": (F, [1, 4, 7, 6])}, {"w": np.ones((4, 2, 3, 3), np.float32)},
     {"group": 2, "auto_pad": "SAME_LOWER", "strides": [2, 2]}, None),
    ("Conv", 11, {"x": (F, [1, 4, 7, 6])}, {"w": np.ones((4, 4, 3, 2), np.float32)},
     {"pads": [2, 0, 1, 3], "strides": [2, 3], "dilations": [2, 2]}, None),
    ("Conv", 11, {"x": (F, [2, 4, 9])}, {"w": np.ones((6, 2, 3), np.float32)},
     {"group": 2, "pads": [1, 2], "strides": [2]}, None),
    ("Conv", 11, {"x": (F, [1, 2, 5, 4, 6])}, {"w": np.ones((3, 2, 2, 3, 2), np.float32)},
     {"pads": [1, 0, 1, 0, 1, 1], "dilations": [2, 1, 2]}, None),
    ("MaxPool", 12, {"x": (F, [1, 2, 5, 4, 6])}, {}, {"kernel_shape": [2, 2, 3], "pads": [0, 1, 1, 1, 0, 1]}, None),
    ("LRN", 13, {"x": (F, [1, 6, 3, 3])}, {}, {"size": 5, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, None),
    ("Flatten", 13, {"x": (F, [2, 3, 4])}, {}, {"axis": -1}, None),
    ("Gather", 13, {"x": (F, [4, 3])}, {"i": np.array([[3, -1], [0, 2]], np.int64)}, {"axis": 0}, None),
    ("Expand", 13, {"x": (F, [3, 1])}, {"s": np.array([2, 1, 4], np.int64)}, {}, None),
    ("Slice", 13, {"x": (F, [6, 5])}, {"s": np.array([-1, 4], np.int64), "e": np.array([-7, -9], np.int64),
                                       "a": np.array([0, 1], np.int64), "t": np.array([-2, -3], np.int64)}, {}, None),
]


@needs_device
@pytest.mark.parametrize(("op", "opset", "inputs", "inits", "attrs", "out_rank"), OLD_FORMS,
                         ids=[f"{f[0]}-{f[1]}-{i}" for i, f in enumerate(OLD_FORMS)])
def test_opset_forms_against_onnxruntime(op: str, opset: int, inputs: dict, inits: dict, attrs: dict,
                                         out_rank: int | None) -> None:
    outputs = ["y", "z"] if op == "Split" else ["y"]
    model = node_model(op, inputs, outputs, opset=opset, inits=inits, out_rank=out_rank, **attrs)
    feeds = {n: rand(*s, seed=k) for k, (n, (_, s)) in enumerate(inputs.items())}
    check(model, feeds)


@needs_device
@pytest.mark.parametrize("base,exponent", [(TensorProto.INT64, TensorProto.INT64), (TensorProto.INT32, TensorProto.INT32),
                                           (TensorProto.INT32, F), (TensorProto.INT64, F)])
def test_pow_of_integer_bases_by_exponents_per_element(base: int, exponent: int) -> None:
    """Pow of an integer base (issue 40) as onnxruntime computes it: pow in double, converted to the base's
    type. 3^33 is exact (below 2^53); 7^20, beyond, is the double nearest it, as in onnxruntime; a negative
    exponent gives 0 (a fraction truncated), a half exponent the integer below the root; negative bases keep
    their signs."""
    b_np, e_np = helper.tensor_dtype_to_np_dtype(base), helper.tensor_dtype_to_np_dtype(exponent)
    wide = base == TensorProto.INT64
    x = np.array([3, -3, 7, 2, 5, 0, 1, -2, 10, 4], dtype=b_np)
    e = np.array([33 if wide else 19, 3, 20 if wide else 11, -1, 0, 5, 9, 7, 2, 0.5 if exponent == F else 3],
                 dtype=e_np)
    model = node_model("Pow", {"X": (base, [10]), "E": (exponent, [10])}, ["Y"])
    got = backend.run_model(model, {"X": x, "E": e})[0]
    want = onnxruntime(model, {"X": x, "E": e})[0]
    assert got.dtype == want.dtype == b_np
    np.testing.assert_array_equal(got, want)
