"""Fusion (issue 24): epilogues in the IR and op.json, every backend's rendering of them, and the graph pass
that folds elementwise operators into their producers, checked against numpy and onnxruntime on PoCL."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.construction import construct
from roller.errors import InputError
from roller.graph.fusion import _split, fold_epilogue, fuse
from roller.graph.reference import evaluate
from roller.hw import load
from roller.ir import load_ops
from roller.ir.reference import bound, random_inputs

ROOT = Path(__file__).resolve().parents[2]
FUSED = load_ops(ROOT / "bench/suites/fused.json")
CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
MM = {"A": [5, 7], "B": [7, 3], "C": [3]}
AB = {"A": [5, 7], "B": [7, 3]}


def _op(expr: str, shapes: dict) -> roller.ir.tensor_expr.TensorExpr:  # type: ignore[name-defined]
    return load_ops({"name": "t", "expr": expr, "shapes": shapes})[0]


def test_epilogue_round_trips_through_op_json() -> None:
    op = _op("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = relu(Y[m,n] + C[n])", MM)
    assert [t.name for t in op.body_inputs] == ["A", "B"] and [t.name for t in op.epilogue_inputs] == ["C"]
    back = load_ops(op.to_json())[0]
    assert back == op and back.content_hash() == op.content_hash()
    plain = _op("Y[m,n] += A[m,k] * B[k,n]", {"A": [5, 7], "B": [7, 3]})
    assert plain.content_hash() != op.content_hash()
    # the epilogue's operations count once per output point
    assert op.flops == plain.flops + 2 * 5 * 3


@pytest.mark.parametrize("expr, shapes, message", [
    # another output: a row kernel's stage, which must reduce over the last statement's other axes
    ("Y[m,n] += A[m,k] * B[k,n]; Z[m,n] = Y[m,n]", AB, "reduce over the last statement's other axes"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[n,m] = Y[m,n]", AB, "an epilogue is 'Y[m,n] = ...'"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] += Y[m,n]", AB, "an epilogue is 'Y[m,n] = ...'"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] + A[m,n]", MM, "read by both statements"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] + C[k]", MM, "an epilogue indexes with the output's axes"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] + C[n+1]", MM, "outside dimension 0 of size 3"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] + D[n]", AB, "tensor 'D' has no entry in 'shapes'"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] + C[n,m]", MM, "C has rank 1 but is indexed with 2"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[0,n]", AB, "reads Y at its own index only"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = Y[m,n] * m", AB, "reads tensors, not axis values"),
    ("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = (Y[m,n]", AB, "column"),
])
def test_bad_epilogues_are_one_line_errors(expr: str, shapes: dict, message: str) -> None:
    with pytest.raises(InputError) as err:
        _op(expr, shapes)
    assert message in str(err.value) and "Traceback" not in str(err.value)


SOFTMAX = "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]"


@pytest.mark.parametrize("expr, message", [
    ("M[r] = X[r,c]; Y[r,c] = X[r,c] - M[r]", "computes a per-row value of its own"),
    ("M[r] max= X[r,c]; M[r] += X[r,c]; Y[r,c] = X[r,c] - M[r]", "computes a per-row value of its own"),
    ("M[r] max= X[r,c]; Y[r,c] = X[r,c] - M[0]", "M is read at its own index [r] only"),
    ("M[r] max= X[r,c]; Y[r,d] = Z[r,d] - M[r]", "reduce over the last statement's other axes (d)"),
    ("M[r] max= X[r,c]; S[r] += X[r,c]; Y[r,c] = X[r,c] - M[r]", "S is computed but never read"),
])
def test_bad_row_kernels_are_one_line_errors(expr: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        _op(expr, {"X": [4, 6], "Z": [4, 5]} if "Z" in expr else {"X": [4, 6]})
    assert message in str(err.value)


def test_row_kernel_parses_renders_and_round_trips() -> None:
    op = _op(SOFTMAX, {"X": [6, 20]})
    assert [st.name for st in op.stages] == ["M", "S"] and op.row_axes == ("r",) and not op.reduce_axes
    assert load_ops(op.to_json())[0] == op
    x = random_inputs(op, seed=4)
    e = np.exp(x["X"].astype(np.float64) - x["X"].max(1, keepdims=True))
    np.testing.assert_allclose(bound(op, x).ref, e / e.sum(1, keepdims=True), rtol=1e-12)
    src = get("cuda").render(construct(op, "h100", top_k=1)[0], load("h100")).source
    assert "rl_st_M" in src and "rl_st_S" in src
    with pytest.raises(InputError, match="does not render row kernels"):
        get("poplar").render(construct(op, "ipu-gc200", top_k=1)[0], load("ipu-gc200"))


def test_reference_applies_the_epilogue_with_its_error_bound() -> None:
    op = _op("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = relu(Y[m,n] + C[n]) * 2.0", MM)
    x = random_inputs(op, seed=1)
    want = np.maximum(x["A"].astype(np.float64) @ x["B"] + x["C"], 0) * 2
    b = bound(op, x)
    np.testing.assert_allclose(b.ref, want, rtol=1e-12)
    np.testing.assert_allclose(roller.reference(op, x), want.astype(np.float32), rtol=1e-6)
    assert (b.bound > 0).all() and (b.bound < 1e-4).all()


@needs_device
@pytest.mark.parametrize("op", FUSED, ids=lambda o: o.name)
@pytest.mark.parametrize("hw", ["pocl-cpu", "h100"])
def test_fused_suite_runs_correctly_on_pocl(op, hw: str) -> None:  # type: ignore[no-untyped-def]
    """Each fused op, as constructed for the CPU (vector path) and for the H100 (staged GPU path, run by the
    OpenCL backend), against the reference's a-priori bound."""
    k = roller.compile(op, hw=hw, backend="opencl", top_k=1)
    x = random_inputs(op, seed=2)
    got = np.asarray(k(**x), dtype=np.float64)
    b = bound(op, x)
    assert (np.abs(got - b.ref) <= b.bound).all(), op.name


def test_epilogue_inputs_neither_staged_nor_aligned() -> None:
    """A fused bias changes neither the tiles construction picks nor what a block stages."""
    conv = {"X": [1, 32, 28, 28], "W": [64, 32, 3, 3], "Y": [1, 64, 28, 28]}
    plain = _op("Y[n,f,h,w] += X[n,c,h+r-1,w+s-1] * W[f,c,r,s]", conv)
    fused = _op("Y[n,f,h,w] += X[n,c,h+r-1,w+s-1] * W[f,c,r,s]; Y[n,f,h,w] = relu(Y[n,f,h,w] + B[f])",
                {**conv, "B": [64]})
    for hw in ("pocl-cpu", "a100"):
        a, b = construct(plain, hw, top_k=3), construct(fused, hw, top_k=3)
        assert [p.tiles for p in a] == [p.tiles for p in b], hw
    art = get("cuda").render(construct(fused, "a100", top_k=1)[0], load("a100"))
    assert "rl_sm_B" not in art.source and "rl_sm_X" in art.source


@pytest.mark.parametrize("source, read, groups", [
    ((1, 128, 768), (1, 128, 12, 64), [[0], [1], [2, 3]]),
    ((2, 6), (2, 6), [[0], [1]]),
    ((768,), (1, 768), [[1]]),
    ((1, 768), (768,), [[], [0]]),
    ((12, 64), (768,), None),   # a merge is not affine
    ((6, 4), (4, 6), None),
])
def test_split_views(source: tuple, read: tuple, groups: list | None) -> None:
    assert _split(source, read) == groups


def test_fold_refuses_a_reader_that_is_not_point_for_point() -> None:
    mm = _op("Y[m,n] += A[m,k] * B[k,n]", {"A": [4, 5], "B": [5, 4]})
    transpose_add = _op("Z[i,j] = P[j,i] + P[i,j]", {"P": [4, 4]})
    assert fold_epilogue(mm, transpose_add, {"P"}) is None
    permuted = fold_epilogue(mm, _op("Z[i,j] = P[j,i] * 2.0", {"P": [4, 4]}), {"P"})
    assert permuted is not None and str(permuted.out_index[0]) == "n"   # Z[i,j] = Y[j,i]: stored transposed


def _zoo(name: str):  # type: ignore[no-untyped-def]
    from tests.support.zoo_graphs import ALL
    return ALL[name]()


@pytest.mark.parametrize("name, most", [("residual_block", 2), ("inverted_residual_block", 3),
                                        ("attention_block", 11), ("squeeze_excite", 4), ("dense_block", 12),
                                        ("classifier_head", 3)])
def test_fused_graphs_compute_what_the_model_does(name: str, most: int) -> None:
    """The fused graph, evaluated operator by operator with numpy, equals the unfused one; the kernel counts
    fall to at most ``most``."""
    from roller.frontends.onnx import import_model

    model, inputs = _zoo(name)
    g = import_model(model)
    f, report = fuse(g)
    assert report.kernels_after == len(f.op_nodes) <= most < report.kernels_before
    want, got = evaluate(g, inputs), evaluate(f, inputs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


@needs_device
@pytest.mark.parametrize("name", ["residual_block", "inverted_residual_block", "attention_block",
                                  "squeeze_excite", "dense_block", "layernorm_decomposed"])
def test_fused_models_match_onnxruntime(name: str) -> None:
    model, inputs = _zoo(name)
    fused = roller.compile_model(model, hw="pocl-cpu")
    unfused = roller.compile_model(model, hw="pocl-cpu", fuse=False)
    assert fused.fusion is not None and unfused.fusion is None
    assert len(fused.kernels) < len(unfused.kernels)
    assert fused.check(inputs)["ok"] and unfused.check(inputs)["ok"]


@pytest.mark.parametrize("name", ["attention_block", "inverted_residual_block", "dense_block"])
def test_solver_partition_is_never_predicted_slower_than_greedy(name: str) -> None:
    from roller.compiler.model import fuse_stage
    from roller.compiler.target import Target
    from roller.frontends.onnx import import_model
    from roller.graph.orchestrate import orchestrate

    model, inputs = _zoo(name)
    g = import_model(model)
    hw = load("pocl-cpu")
    solved, rs = fuse_stage(g, Target(hw, CL), "solver")
    greedy, rg = fuse_stage(g, Target(hw, CL), "greedy")
    assert rs is not None and rg is not None and rs.method == "solver" and rg.method == "greedy"
    assert rs.predicted_s <= rg.predicted_s * (1 + 1e-9) and rs.candidates > rs.kernels_after
    want, got = evaluate(g, inputs), evaluate(solved, inputs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    # with every operator costing the same, the solver minimises the number of kernels
    _, unit = orchestrate(g, lambda e: 1.0)
    assert unit.kernels_after <= min(rs.kernels_after, rg.kernels_after)


def test_fuse_option_is_checked() -> None:
    model, _ = _zoo("residual_block")
    with pytest.raises(InputError, match="fuse must be one of solver, greedy, none"):
        roller.compile_model(model, hw="pocl-cpu", fuse="fastest")


@pytest.mark.slow
def test_fused_suite_host_runs_on_ipu_descriptions(tmp_path: Path) -> None:
    """The Poplar codelets of the fused float32 ops, compiled with g++ against the stand-in header and run
    vertex by vertex (no Poplar SDK here): each output element written once, within the reference's bound."""
    import shutil

    from roller.backends.ipu_poplar.hostrun import host_run

    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    ops = [o for o in FUSED if o.output.dtype == "float32" and not o.stages]   # poplar renders no row kernels
    be = get("poplar")
    for hw_name in ("ipu-gc2", "ipu-gc200"):
        hw = load(hw_name)
        arts = [(be.render(construct(op, hw, top_k=1)[0], hw), random_inputs(op, seed=3)) for op in ops]
        results, _ = host_run(arts, tmp_path / hw_name, jobs=2)
        for op, (_, x) in zip(ops, arts):
            r = results[op.name]
            b = bound(op, x)
            assert (np.abs(r.output.reshape(op.output.shape) - b.ref) <= b.bound).all(), (hw_name, op.name)
            assert (r.writes == 1).all(), (hw_name, op.name)


def test_row_kernel_shapes_name_only_its_tensors() -> None:
    with pytest.raises(InputError, match="shapes.Q: tensor 'Q' does not appear"):
        _op("M[r] max= X[r,c]; Y[r,c] = X[r,c] - M[r]", {"X": [3, 4], "Q": [2]})
    with pytest.raises(InputError, match="a name not in 'shapes'"):
        _op("M[r] max= X[r,c]; Y[r,c] = X[r,c] - M[r]", {"X": [3, 4], "M": [3]})


@pytest.mark.parametrize("method", ["solver", "greedy"])
def test_a_fused_kernel_reads_each_value_through_one_tensor(method: str) -> None:
    """SiLU after a convolution with a bias (x * sigmoid(x), x = conv + b), fused either way: no kernel's
    epilogue binds one value to two tensors, and the kernels compute what the model does."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["X", "W"], ["C"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["C", "B4"], ["x"]),
             helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["Y"])]
    b4 = numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "B4")
    g = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4, 10, 10])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 8, 10, 10])], [w, b, b4])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    m = roller.compile_model(model, hw="pocl-cpu", fuse=method)
    for node in m.graph.op_nodes:
        epilogue = {t.name for t in node.expr.epilogue_inputs}
        bound = [(v, t.shape, t.view) for t, v in zip(node.expr.inputs, node.inputs) if t.name in epilogue]
        assert len(bound) == len(set(bound)), node.expr.statement()
    if CL.can_run_here():
        x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
        m.check({"X": x})


def test_two_tensors_bound_to_one_value_become_one() -> None:
    """What a rewrite left when it inlined the bias add of SiLU into both of its readers (EfficientNet-B0's
    solver-fused convolutions: two kernel arguments for one bias, whose loads no compiler merges)."""
    from roller.graph.fusion import one_read_per_value
    from roller.graph.ir import OpNode
    from roller.ir.build import build_expr

    expr = build_expr("silu", "Y[i,j] += X[i,k] * W[k,j]; Y[i,j] = (Y[i,j] + A[j]) * sigmoid(Y[i,j] + B[j])",
                      {"X": [4, 5], "W": [5, 8], "A": [8], "B": [8], "Y": [4, 8]})
    names = {"X": "x", "W": "w", "A": "bias", "B": "bias"}
    node = OpNode("silu", expr, tuple(names[t.name] for t in expr.inputs), "y")
    merged = one_read_per_value(node)
    assert sorted(merged.inputs) == ["bias", "w", "x"] and len(merged.expr.inputs) == 3
    assert merged.expr.statement().count("A[j]") == 2 and "B[" not in merged.expr.statement()
    other = OpNode("silu", expr, tuple({**names, "B": "scale"}[t.name] for t in expr.inputs), "y")
    assert one_read_per_value(other) is other   # two values: nothing to merge
    # a value the body reads stays the body's own tensor, even where the epilogue reads it too
    both = OpNode("silu", expr, tuple({**names, "A": "x", "B": "x"}[t.name] for t in expr.inputs), "y")
    kept = one_read_per_value(both)
    assert [t.name for t in kept.expr.inputs] == ["X", "W", "A"] and kept.inputs == ("x", "w", "x")
