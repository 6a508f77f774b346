"""Resize in linear and cubic mode (issue 40): one weighted-rows operator per axis that changes, its rows and
weights from ONNX's reference; against onnxruntime on the forms segmentation models export, against the
reference where a value is not finite, and refused in one line where it cannot be built."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import roller
from roller.errors import InputError
from roller.frontends.onnx import import_model


def _resize_model(shape: list[int], out: list[int], mode: str, dtype: int = TensorProto.FLOAT,
                  scales: list[float] | None = None, sizes: list[int] | None = None, opset: int = 19,
                  **attrs: object) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array([], np.float32), "roi")]
    names = ["x", "roi"]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        names.append("scales")
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        names += ["", "sizes"]
    node = helper.make_node("Resize", names, ["y"], mode=mode, **attrs)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


CASES = {
    # torch.nn.functional.interpolate(mode="bilinear", align_corners=False), as DeepLabV3's head exports it
    "bilinear_up_sizes": dict(shape=[1, 3, 9, 11], out=[1, 3, 33, 41], mode="linear", sizes=[1, 3, 33, 41],
                              coordinate_transformation_mode="pytorch_half_pixel"),
    "bilinear_align_corners": dict(shape=[1, 2, 7, 5], out=[1, 2, 14, 10], mode="linear", scales=[1, 1, 2, 2],
                                   coordinate_transformation_mode="align_corners"),
    "bicubic_up": dict(shape=[1, 2, 6, 6], out=[1, 2, 15, 15], mode="cubic", scales=[1, 1, 2.5, 2.5]),
    "bicubic_down_antialias": dict(shape=[1, 2, 24, 20], out=[1, 2, 7, 6], mode="cubic", sizes=[1, 2, 7, 6],
                                   antialias=1),
    "linear_down_antialias_one_axis": dict(shape=[2, 3, 40], out=[2, 3, 9], mode="linear", sizes=[9],
                                           axes=[2], antialias=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resize_matches_onnxruntime(case: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    spec = dict(CASES[case])
    model = _resize_model(**spec)  # type: ignore[arg-type]
    x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32)  # type: ignore[arg-type]
    m = roller.compile_model(model, hw="pocl-cpu")
    got = m.run({"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


def test_a_non_finite_row_reaches_only_the_rows_that_weigh_it() -> None:
    """As onnxruntime (the reference saturates inf to float32's largest value when it casts back)."""
    ort = pytest.importorskip("onnxruntime")
    model = _resize_model([1, 1, 8, 8], [1, 1, 16, 16], "linear", scales=[1, 1, 2, 2])
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)
    x[0, 0, 3, 5] = np.inf
    got = roller.compile_model(model, hw="pocl-cpu").run({"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert (~np.isfinite(got)).sum() == (~np.isfinite(want)).sum() == 16   # 4 x 4 of the 256 rows
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def test_tf_crop_and_resize_extrapolates_outside_the_input() -> None:
    model = _resize_model([1, 1, 6, 6], [1, 1, 5, 5], "linear", sizes=[1, 1, 5, 5], extrapolation_value=-3.0,
                          coordinate_transformation_mode="tf_crop_and_resize")
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32), "roi"))
    x = np.random.default_rng(2).standard_normal((1, 1, 6, 6)).astype(np.float32)
    got = roller.compile_model(model, hw="pocl-cpu").run({"x": x})["y"]
    want = np.asarray(ReferenceEvaluator(model).run(None, {"x": x})[0])
    assert (want == -3.0).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_refusals_are_one_line() -> None:
    ints = _resize_model([1, 1, 4, 4], [1, 1, 8, 8], "linear", dtype=TensorProto.INT32, scales=[1, 1, 2, 2])
    with pytest.raises(InputError, match="mode='linear' on a int32 tensor is not supported") as err:
        import_model(ints, source="m.onnx")
    assert "\n" not in str(err.value)
    wide = _resize_model([1, 1, 4, 400], [1, 1, 4, 5], "linear", sizes=[1, 1, 4, 5], antialias=1)
    with pytest.raises(InputError, match="weighs .* input rows; at most 32") as err:
        import_model(wide, source="m.onnx")
    assert "\n" not in str(err.value)
