"""The parts of bench/gpu_checks.py that need no GPU: a model's weight-free skeleton and its restoration."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu_checks", ROOT / "bench/gpu_checks.py")
checks = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["bench_gpu_checks"] = checks
_spec.loader.exec_module(checks)  # type: ignore[union-attr]


def _model(path: Path) -> np.ndarray:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 32)) * 0.5 + 0.25).astype(np.float32)   # 8 KiB: stored outside
    b = rng.standard_normal(32).astype(np.float32)                         # 128 B: stays in the graph
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


def test_skeleton_keeps_the_graph_and_weight_statistics_not_the_weights(tmp_path: Path) -> None:
    w = _model(tmp_path / "m.onnx")
    assert checks.skeleton(tmp_path / "m.onnx", tmp_path / "skel") == 1
    skel = tmp_path / "skel" / "m.onnx"
    assert skel.stat().st_size < w.nbytes and not (tmp_path / "skel" / checks.WEIGHTS).exists()
    folder = tmp_path / "restored"
    folder.mkdir()
    model = onnx.load(checks.restored(skel, folder))
    onnx.checker.check_model(model, full_check=True)
    got = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert got["w"].shape == w.shape and not np.array_equal(got["w"], w)
    assert abs(got["w"].mean() - w.mean()) < 0.05 and abs(got["w"].std() - w.std()) < 0.05
    original = {i.name: numpy_helper.to_array(i) for i in onnx.load(tmp_path / "m.onnx").graph.initializer}
    assert np.array_equal(got["b"], original["b"])   # small tensors travel as they are


def test_ranking_scores_the_model_on_measured_candidates(tmp_path: Path) -> None:
    """A report whose measured times follow the model's own order scores 1.0 (top-1 the best, Spearman 1);
    reversed, the top-1 is the slowest."""
    import json

    import roller.hw as H
    from roller.backends import get

    gpu = checks._bench_gpu()
    (sel, _), = gpu.select_ops("roller119", "C9", False, 8.0, 20.0)
    _, progs = gpu.candidates(sel, H.load("h200"), get("cuda"), 10)
    times = [p.prediction.time_ms for p in progs]
    assert len(set(times)) > 1
    for order, expect in ((times, 1.0), (times[::-1], max(times) / min(times))):
        report = tmp_path / "r.json"
        rows = [{"name": "C9", "kind": "conv2d", "line": progs[0].line(), "candidates": order}]
        report.write_text(json.dumps({"meta": {}, "rows": rows}))
        got = checks.ranking(report, "h200")
        assert got["ops"] == 1 and abs(got["per_op"]["C9"]["top1_over_best"] - expect) < 1e-9
