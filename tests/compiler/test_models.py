"""Whole models: ONNX import, the memory plan, the executor on PoCL against onnxruntime, the CLI."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get
from roller.cli.main import main
from roller.errors import InputError
from roller.frontends.onnx import import_model
from roller.graph import OpNode, plan
from roller.graph.reference import evaluate

ROOT = Path(__file__).resolve().parents[2]
CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
C = 8


def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17):
    g = helper.make_graph(nodes, "m", inputs, outputs,
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def residual(c: int = C, hw: int = 10):
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((c, c, 3, 3)) * 0.2, "b1": rng.standard_normal(c),
             "g": rng.random(c) + 0.5, "bb": rng.standard_normal(c), "m": rng.standard_normal(c) * 0.1,
             "v": rng.random(c) + 0.5, "w2": rng.standard_normal((c, c, 3, 3)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("BatchNormalization", ["c1", "g", "bb", "m", "v"], ["bn1"]),
             helper.make_node("Relu", ["bn1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], inits)


def _ort(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_import_folds_batchnorm_and_keeps_local_tensor_names() -> None:
    g = import_model(residual())
    kinds = [n.expr.kind for n in g.op_nodes]
    assert kinds.count("conv2d") == 2 and "batchnorm" not in kinds   # folded into conv1's weights
    assert all({t.name for t in n.expr.inputs} <= {"X", "W", "B", "T0", "T1"} for n in g.op_nodes)
    x = np.random.default_rng(1).standard_normal((1, C, 10, 10)).astype(np.float32)
    got = evaluate(g, {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(residual(), {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_memory_plan_reuses_buffers_by_lifetime() -> None:
    g = import_model(residual())
    p = plan(g)
    inter = [b for b in p.buffers if b.role == "intermediate"]
    values = [v for v in g.values if v not in g.inputs and v not in g.constants and v not in g.outputs]
    assert len(inter) < len(values) and any(len(b.values) > 1 for b in inter)
    # no buffer holds two values whose lifetimes overlap: each reuse starts after the previous value's last read
    order = {n.output: i for i, n in enumerate(g.nodes)}
    last = {}
    for i, n in enumerate(g.nodes):
        for r in n.reads:
            last[r] = i
    for b in inter:
        spans = sorted((order[v], last.get(v, order[v])) for v in b.values)
        assert all(a[1] <= b2[0] for a, b2 in itertools.pairwise(spans)), b


@needs_device
def test_residual_block_matches_onnxruntime_and_uploads_weights_once() -> None:
    model = residual()
    m = roller.compile_model(model, hw="pocl-cpu")
    x = np.random.default_rng(2).standard_normal((1, C, 10, 10)).astype(np.float32)
    ref = _ort(model, {"x": x})[0]
    y = m.run({"x": x})["y"]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    dev = m.executor.device
    first = (dev.uploads, dev.uploaded_bytes, dev.downloads, dev.downloaded_bytes)
    weights = sum(a.nbytes for a in m.graph.constants.values())
    # The padded buffers of the 3x3 windows are filled once, with the weights; each run copies into them.
    padded = [b for b in m.plan.buffers if b.role == "padded"]
    assert padded and all(b.fill == 0.0 for b in padded)
    assert first[1] == weights + x.nbytes + sum(b.nbytes for b in padded) and first[2] == 1
    y2 = m(x)
    assert (dev.uploads - first[0], dev.uploaded_bytes - first[1]) == (1, x.nbytes)
    assert (dev.downloads - first[2], dev.downloaded_bytes - first[3]) == (1, y.nbytes)
    np.testing.assert_array_equal(y2, y)
    assert [k.name for k in m.kernels] == [n.expr.name if n.expr.name in {k.name for k in m.kernels}
                                          else m.by_key[roller.graph.kernel_key(n)].name for n in m.graph.op_nodes]
    assert m.check({"x": x})["ok"] and m.benchmark(repeat=2) > 0


@needs_device
def test_identical_operators_share_one_kernel() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                   [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4, 6])], {})
    m = roller.compile_model(model, hw="pocl-cpu", fuse=False)
    assert len(m.kernels) == 3 and len(m.by_key) == 2
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(m(x), np.maximum(-np.maximum(x, 0), 0))


@needs_device
def test_concat_split_and_slice_are_device_copies() -> None:
    nodes = [helper.make_node("Concat", ["x", "x2"], ["c"], axis=1),
             helper.make_node("Split", ["c"], ["s0", "s1"], axis=2, num_outputs=2),
             helper.make_node("Slice", ["s1", "st", "en", "ax"], ["sl"]),
             helper.make_node("Add", ["s0", "sl"], ["y"])]
    inits = {}
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 5]),
                           helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 4, 6, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 3, 5])], inits, opset=18)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
                                    (("st", [0]), ("en", [3]), ("ax", [2]))])
    m = roller.compile_model(model, hw="pocl-cpu")
    assert m.summary()["copies"] >= 3
    rng = np.random.default_rng(4)
    x, x2 = rng.standard_normal((2, 3, 6, 5)).astype(np.float32), rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    np.testing.assert_array_equal(m(x, x2), _ort(model, {"x": x, "x2": x2})[0])


def test_unsupported_op_names_the_node_and_what_is_supported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _model([helper.make_node("Det", ["x"], ["y"], name="the_det")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], {})
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["build", "--hw", "v100", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 'the_det' (Det): op type Det is not supported; supported: Abs" in err
    assert not (tmp_path / "out").exists()


def test_open_dimensions_need_a_shape(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], {})
    with pytest.raises(InputError, match=r"dimension 0 is 'batch'; give static sizes with --shape x="):
        import_model(model)
    assert import_model(model, {"x": [3, 4]}).values["y"].shape == (3, 4)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["build", "--hw", "v100", str(path), "--shape", "x=2,4", "-o", str(tmp_path / "o")]) == 0
    assert main(["build", "--hw", "v100", str(path), "--shape", "x=2,-4", "-o", str(tmp_path / "o")]) == 2
    assert "--shape" in capsys.readouterr().err


@pytest.mark.parametrize("hw", ["h100", "mi50", "ipu-gc200"])
def test_build_writes_every_kernel_and_the_plan(tmp_path: Path, hw: str) -> None:
    path = tmp_path / "res.onnx"
    onnx.save(residual(), path)
    out = tmp_path / "out"
    assert main(["build", "--hw", hw, str(path), "-o", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    kernels = {s["kernel"] for s in doc["steps"] if s["kind"] == "kernel"}
    assert kernels == set(doc["kernels"]) and all((out / k / "launch.json").is_file() for k in kernels)
    assert {b["role"] for b in doc["buffers"]} >= {"constant", "input", "output"}
    ids = {b["id"] for b in doc["buffers"]}
    assert all(set(s["args"]) <= ids for s in doc["steps"] if s["kind"] == "kernel")
    with np.load(out / "weights.npz") as w:   # by buffer id: no name of the model's reaches a member name
        assert set(w.files) == {f"b{b['id']}" for b in doc["buffers"] if b["role"] == "constant"}


@needs_device
def test_cli_run_checks_against_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "res.onnx"
    onnx.save(residual(), path)
    assert main(["run", "--hw", "pocl-cpu", str(path), "--check", "--repeat", "2",
                 "--save", str(tmp_path / "y.npz")]) == 0
    line = capsys.readouterr().out
    assert "check ok against onnxruntime" in line and "launches" in line
    assert re.search(r"  built in \d+\.\d s  ", line), line   # the build's seconds, as the README shows
    with np.load(tmp_path / "y.npz") as y:
        assert y["y"].shape == (1, C, 10, 10)


@needs_device
def test_the_build_records_each_stage_s_seconds() -> None:
    m = roller.compile_model(residual(), hw="pocl-cpu")
    assert m.stages is not None and list(m.stages.seconds) == ["import", "fuse", "block", "pad", "pack", "build", "compile", "plan"]
    assert all(s >= 0 for s in m.stages.seconds.values())
    assert sum(m.stages.seconds.values()) <= m.compile_s


def test_every_op_node_comes_from_a_model_node() -> None:
    g = import_model(residual())
    assert all(isinstance(n, OpNode) and n.origin for n in g.op_nodes)


def test_compare_reports_whole_model_totals(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "res.onnx"
    onnx.save(residual(), path)
    out = tmp_path / "report"
    assert main(["compare", "--hw", "v100", "--hw", "mi50", str(path), "-o", str(out), "--no-plots"]) == 0
    doc = json.loads((out / "results.json").read_text())
    model = doc["model"]
    g = import_model(residual())
    assert model["nodes"] == len(g.op_nodes) and model["operators"] == len({o["op"] for o in model["ops"]})
    for hw in ("v100", "mi50"):
        per_op = {e["op"]: e["predicted_ms"] for e in doc["results"] if e["hw"] == hw}
        want = sum(per_op[r["op"]] * r["uses"] for r in model["ops"])
        assert model["total_predicted_ms"][hw] == pytest.approx(want)
    assert "Whole model" in (out / "report.md").read_text() and "model m (" in capsys.readouterr().out


def _model_arts(hw: str) -> tuple:
    """The kernels ``roller build`` writes for the example ResNet on ``hw``."""
    from roller.compiler.model import build_stage, pack_stage, pad_stage
    from roller.compiler.target import Target
    from roller.graph.fusion import fuse

    target = Target.resolve(hw)
    graph, _ = fuse(import_model(ROOT / "examples/models/mini_resnet.onnx"))   # epilogues included
    packed = pack_stage(pad_stage(graph, target), target)
    kernels, _ = build_stage(packed, target)
    return target.hw, [k.artifact for k in kernels.values()]


@pytest.mark.slow
@pytest.mark.nvcc
def test_model_kernels_compile_with_nvcc_for_h100(tmp_path: Path) -> None:
    from roller.backends.cuda.toolchain import compile_unit
    from roller.errors import ToolchainError

    hwd, arts = _model_arts("h100")
    try:
        result = compile_unit("\n".join(a.source for a in arts), hwd.target, tmp_path, "mini_resnet")
    except ToolchainError as err:
        pytest.skip(str(err))
    assert set(result.usage) == {a.kernel_name for a in arts}
    smem = next(m for m in hwd.memory if m.scope == "block").capacity_per_block_bytes
    for name, u in result.usage.items():
        assert u.registers <= hwd.parallelism.max_registers_per_thread and u.spill_stores == 0, name
        assert u.smem_bytes <= smem, name


@pytest.mark.slow
@pytest.mark.hipcc
def test_model_kernels_compile_with_hipcc_for_mi50(tmp_path: Path) -> None:
    from roller.backends.rocm_hip import hipcc
    from roller.errors import ToolchainError

    hwd, arts = _model_arts("mi50")
    try:
        usage = hipcc.check_artifacts(arts, hwd, tmp_path)
    except ToolchainError as err:
        pytest.skip(str(err))
    assert set(usage) == {a.kernel_name for a in arts}
    for art in arts:
        plan = art.extra["plan"]
        problems = hipcc.limits_report(usage[art.kernel_name], hwd, art.launch["block"][0], plan.smem_bytes,
                                       len(plan.inputs) if plan.staged else 0)
        assert problems == [], (art.kernel_name, problems)


@needs_device
def test_a_model_with_one_layer_changed_rebuilds_that_layer_only() -> None:
    """Kernels are cached by operator: new weights build nothing; a middle convolution changed from 3x3 to 5x5
    rebuilds its kernel and its producer's (which writes its output inside the padding the new window reads:
    graph.md, "Values made inside their padding"), and takes the last layer's from the cache."""
    rng = np.random.default_rng(3)

    def three_convs(k: int):
        inits = {"w1": rng.standard_normal((8, 4, 3, 3)), "w2": rng.standard_normal((8, 8, k, k)),
                 "w3": rng.standard_normal((6, 8, 1, 1))}
        nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["a"], ["r"]),
                 helper.make_node("Conv", ["r", "w2"], ["b"], pads=[k // 2] * 4),
                 helper.make_node("Conv", ["b", "w3"], ["y"])]
        return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 12, 12])], inits)

    from roller.backends.opencl.programs import COUNTS

    first = roller.compile_model(three_convs(3), hw="pocl-cpu")
    assert first.cache_hits == 0 and len(first.by_key) == 3
    compiled = COUNTS["kernels_compiled"]
    assert roller.compile_model(three_convs(3), hw="pocl-cpu").cache_hits == 3   # other weights: nothing built
    assert COUNTS["kernels_compiled"] == compiled                                # nor compiled
    changed = roller.compile_model(three_convs(5), hw="pocl-cpu")
    assert changed.cache_hits == 1
    assert [k.cache_hit for k in changed.kernels] == [False, False, True]
    assert COUNTS["kernels_compiled"] == compiled + 2    # the last layer's kernel comes from the stored program
