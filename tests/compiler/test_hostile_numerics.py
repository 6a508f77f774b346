"""Wrong answers and false alarms (issue 21, items 6-10): the check's error bound, NaN propagation, what ``+=``
means, average pooling's divisor, float16 and bfloat16 on OpenCL.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.cli.main import main
from roller.compiler.check import check_against
from roller.construction import construct
from roller.errors import CheckError
from roller.hw import load
from roller.ir import load_op
from roller.ir.reference import _window_view, bound, random_inputs, reference

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def conv(name: str, c: int, hw: int, f: int, k: int, stride: int = 1) -> dict:
    return {"name": name, "op": "conv2d", "N": 1, "C": c, "H": hw, "W": hw, "F": f, "KH": k, "KW": k,
            "stride": stride, "padding": "SAME"}


def matmul(name: str, m: int, n: int, k: int) -> dict:
    return {"name": name, "op": "matmul", "M": m, "N": n, "K": k}


# Every distinct layer shape of ResNet-18 (224x224 input) and of a BERT-base encoder layer (sequence 128).
RESNET18 = [conv("conv1", 3, 224, 64, 7, 2), conv("l1", 64, 56, 64, 3), conv("l2_down3x3", 64, 56, 128, 3, 2),
            conv("l2", 128, 28, 128, 3), conv("l2_proj", 64, 56, 128, 1, 2), conv("l3_down3x3", 128, 28, 256, 3, 2),
            conv("l3", 256, 14, 256, 3), conv("l3_proj", 128, 28, 256, 1, 2), conv("l4_down3x3", 256, 14, 512, 3, 2),
            conv("l4", 512, 7, 512, 3), conv("l4_proj", 256, 14, 512, 1, 2), matmul("fc", 1, 1000, 512),
            {"name": "gap", "op": "avgpool2d", "N": 1, "C": 512, "H": 7, "W": 7, "K": 7}]
BERT = [matmul("qkv", 128, 2304, 768), {"name": "scores", "op": "batch_matmul", "B": 12, "M": 128, "N": 128, "K": 64},
        {"name": "context", "op": "batch_matmul", "B": 12, "M": 128, "N": 64, "K": 128},
        matmul("out_proj", 128, 768, 768), matmul("ffn_up", 128, 3072, 768), matmul("ffn_down", 128, 768, 3072),
        {"name": "ln_mean", "op": "reduce", "kind": "mean", "shape": [128, 768], "axes": [1]}]


def float32_output(op) -> tuple[np.ndarray, dict]:  # type: ignore[no-untyped-def]
    """What a correct float32 kernel computes (BLAS sgemm through einsum, in float32 throughout)."""
    from roller.ir.reference import _factors

    x = random_inputs(op, seed=0)
    reads, scale = _factors(op.body)
    letters = {a.name: chr(97 + i) for i, a in enumerate(op.axes)}
    specs, operands = [], []
    for r in reads:
        plain = [i.plain_axis() for i in r.index]
        if None in plain:
            view, axes = _window_view(x[r.tensor], r.index, op.extents, op.pad_value)
        else:
            view, axes = x[r.tensor], plain
        specs.append("".join(letters[a] for a in axes))
        operands.append(view)
    out = "".join(letters[i.plain_axis()] for i in op.out_index)
    y = np.einsum(",".join(specs) + "->" + out, *operands, optimize=True)
    return (y * np.float32(scale)).astype(np.float32), x


@pytest.mark.parametrize("doc", RESNET18 + BERT, ids=lambda d: d["name"])
def test_float32_layers_pass_the_check(doc) -> None:
    op = load_op(doc)
    y, x = float32_output(op)
    check_against(op.name, op, x, y)


@pytest.mark.parametrize("doc", [matmul("seq3072", 4, 32, 3072), conv("seq4608", 512, 3, 8, 3)],
                         ids=lambda d: d["name"])
def test_sequential_float32_sums_pass_the_check(doc) -> None:
    """The worst usual order: one accumulator adding the terms one by one in float32 (np.cumsum is sequential)."""
    op = load_op(doc)
    x = random_inputs(op, seed=4)
    if op.kind == "matmul":
        terms = x["A"][:, :, None] * x["B"][None, :, :]  # [M, K, N], float32 products
        y = np.cumsum(terms, axis=1, dtype=np.float32)[:, -1, :]
    else:
        view, _axes = _window_view(x["X"], op.accesses("X")[0], op.extents, 0.0)
        xs = np.einsum("nchrws->nhwcrs", view).reshape(*[op.extents[a] for a in ("h", "w")], -1)
        w = x["W"].reshape(x["W"].shape[0], -1)
        terms = xs[:, :, None, :] * w[None, None, :, :]
        y = np.cumsum(terms, axis=-1, dtype=np.float32)[..., -1].transpose(2, 0, 1)[None]
    check_against(op.name, op, x, y)


def test_summing_constants_sequentially_passes() -> None:
    """The case a typical-growth (sqrt K) bound would flag: 0.1 added 2^20 times in float32 drifts by 1e-3."""
    op = load_op({"name": "s", "op": "reduce", "kind": "sum", "shape": [2, 1 << 20], "axes": [1]})
    x = {"X": np.full((2, 1 << 20), 0.1, np.float32)}
    y = np.cumsum(x["X"], axis=1, dtype=np.float32)[:, -1]
    assert abs(float(y[0]) - 0.1 * (1 << 20)) > 10 * math.sqrt(1 << 20) * 2**-24 * 0.1 * (1 << 20)
    check_against(op.name, op, x, y)


@pytest.mark.parametrize("doc", [conv("resnet_l4", 512, 7, 512, 3), matmul("bert_ffn_down", 128, 768, 3072),
                                 matmul("mm16", 16, 4096, 4096)], ids=lambda d: d["name"])
def test_the_audits_kernels_pass_run_check(tmp_path, capsys, doc) -> None:
    path = tmp_path / "op.json"
    path.write_text(json.dumps(doc))
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(path), "--check", "--top-k", "1", "--repeat", "1")
    assert rc == 0 and "check ok" in out, err


def test_a_whole_file_runs_to_the_end(tmp_path, capsys) -> None:
    """--check used to stop part-way through a file of ordinary layers with a false alarm."""
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"ops": [matmul("qkv_s", 32, 768, 768), matmul("ffn_down_s", 32, 768, 3072),
                                        conv("l3_s", 256, 14, 64, 3)]}))
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(path), "--check", "--top-k", "1", "--repeat", "1")
    assert rc == 0 and out.count("check ok") == 3, err


def _kernel_output(doc: dict, hw: str = "pocl-cpu") -> tuple[np.ndarray, object]:
    op = load_op(doc)
    k = roller.compile(op, hw=hw, backend="opencl", cache=False, top_k=1)
    return k, op


@pytest.mark.parametrize("good,bad", [
    (conv("c", 32, 8, 8, 3), {"name": "c", "expr": "Y[n,f,h,w] += X[n,c,h+r-1,w+s] * W[f,c,r,s]",
                              "shapes": {"X": [1, 32, 8, 8], "W": [8, 32, 3, 3], "Y": [1, 8, 8, 8]}}),
    (matmul("m", 64, 48, 3072), {"name": "m", "expr": "C[m,n] += A[m,k] * B[k+1,n]",
                                  "shapes": {"A": [64, 3072], "B": [3072, 48], "C": [64, 48]}}),
    (matmul("m", 64, 48, 3072), {"name": "m", "expr": "C[m,n] += A[m,k] * B[k,n]",
                                  "shapes": {"A": [64, 3071], "B": [3071, 48], "C": [64, 48]}}),
], ids=["conv-shifted-window", "matmul-shifted-k", "matmul-missing-last-term"])
def test_an_index_off_by_one_fails_the_check(good, bad) -> None:
    """A real kernel with one index off by one (or its reduction one term short) against the right op's bound."""
    k_bad, op_bad = _kernel_output(bad)
    op = load_op(good)
    x = random_inputs(op, seed=0)
    given = {t.name: x[t.name][tuple(slice(0, n) for n in t.storage_shape)] for t in op_bad.inputs}
    y = k_bad(**given)
    with pytest.raises(CheckError, match="beyond the error bound"):
        check_against(op.name, op, x, y)


def test_the_message_names_the_element_and_its_bound() -> None:
    op = load_op(matmul("m", 8, 8, 3072))
    x = random_inputs(op, seed=0)
    y, _ = float32_output(op)
    y = y.copy()
    y[3, 5] += 1.0
    with pytest.raises(CheckError) as info:
        check_against("m", op, x, y)
    text = str(info.value)
    assert "1 of 64 elements" in text and "worst at [3, 5]" in text and "> bound" in text
    assert "sum of 3072 terms" in text
    got, want = float(y[3, 5]), float(reference(op, x)[3, 5])
    assert f"got {got:.9g}" in text and f"expected {bound(op, x).ref[3, 5]:.9g}" in text and want != got


# ---- 7: NaN ------------------------------------------------------------------------------------------------------------

NAN_OPS = [
    {"name": "rmax", "op": "reduce", "kind": "max", "shape": [6, 40], "axes": [1]},
    {"name": "rmin", "op": "reduce", "kind": "min", "shape": [6, 40], "axes": [1]},
    {"name": "mpool", "op": "maxpool2d", "N": 1, "C": 3, "H": 12, "W": 12, "K": 3, "stride": 2, "padding": "SAME"},
    {"name": "rl", "op": "elementwise", "fn": "relu", "shapes": {"X": [3, 70]}},
    {"name": "mx", "expr": "Y[i,j] = max(X[i,j], 0.5) + min(X[i,j], -0.5)", "shapes": {"X": [3, 70]}},
    {"name": "mx2", "expr": "Y[i,j] = max(0.5, X[i,j]) + min(-0.5, X[i,j])", "shapes": {"X": [3, 70]}},
    {"name": "mxred", "expr": "Y[i] max= max(X[i,k], 0.0) * 2", "shapes": {"X": [5, 33]}},
]


def _with_nans(op) -> dict:  # type: ignore[no-untyped-def]
    x = random_inputs(op, seed=0)
    flat = x["X"].reshape(-1)
    flat[::7] = np.nan
    return x


@pytest.mark.parametrize("doc", NAN_OPS, ids=lambda d: d["name"])
@pytest.mark.parametrize("hw", ["pocl-cpu", "v100", "ipu-gc200"])
def test_nan_propagates(doc, hw) -> None:
    op = load_op(doc)
    k = roller.compile(op, hw=hw, backend="opencl", cache=False, top_k=1)
    x = _with_nans(op)
    y = k(**x)
    ref = reference(op, x)
    assert np.isnan(ref).any()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    check_against(op.name, op, x, y)


@pytest.mark.parametrize("doc", NAN_OPS[:3], ids=lambda d: d["name"])
def test_nan_propagates_in_the_hip_emulation(tmp_path, doc) -> None:
    from roller.backends.rocm_hip import emulate
    from roller.errors import ToolchainError

    try:
        emulate.compiler()
    except ToolchainError as err:
        pytest.skip(str(err))
    op = load_op(doc)
    hw = load("mi50")
    art = get("hip").render(construct(op, hw, top_k=1)[0], hw)
    x = _with_nans(op)
    y = emulate.run(art, [x[t.name] for t in op.inputs], tmp_path)
    np.testing.assert_array_equal(np.isnan(y.reshape(op.output.shape)), np.isnan(reference(op, x)))


def test_nan_propagates_in_the_poplar_host_run(tmp_path) -> None:
    import shutil

    from roller.backends.ipu_poplar.hostrun import host_run

    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    hw = load("ipu-gc2")
    cases = []
    for doc in NAN_OPS[:4]:
        op = load_op(doc)
        cases.append((get("poplar").render(construct(op, hw, top_k=1)[0], hw), _with_nans(op)))
    results, _ = host_run(cases, tmp_path, jobs=1)
    for doc, (_, x) in zip(NAN_OPS[:4], cases):
        op = load_op(doc)
        ref = reference(op, x)
        np.testing.assert_array_equal(np.isnan(results[op.name].output.reshape(ref.shape)), np.isnan(ref))


def test_a_scalar_output_prints_its_value() -> None:
    op = load_op({"name": "total", "op": "reduce", "kind": "sum", "shape": [10], "axes": [0]})
    x = {"X": np.arange(10, dtype=np.float32)}
    with pytest.raises(CheckError) as info:
        check_against("total", op, x, np.float32(44.0))
    assert "at the scalar output: got 44, expected 45" in str(info.value)
    with pytest.raises(CheckError, match="got nan, expected 45"):
        check_against("total", op, x, np.float32(np.nan))


# ---- 8: what += means ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr,message", [
    ("Y[m,n] += A[m,k]*B[k,n] + bias[n]", "the term 'bias[n]' does not depend on the reduction axes (k)"),
    ("Y[m,n] += A[m,k]*B[k,n] - 1.5", "the term '1.5' does not depend on the reduction axes (k)"),
    ("Y[m,n] += relu(A[m,k]*B[k,n])", "relu() wraps a product over the reduction axes (k)"),
    ("Y[m,n] += max(A[m,k]*B[k,n], 0)", "max() wraps a product over the reduction axes (k)"),
    ("Y[m,n] += exp(A[m,k]/B[k,n]) * 2", "exp() wraps a product over the reduction axes (k)"),
])
def test_plus_equals_bodies_read_otherwise_are_rejected(tmp_path, capsys, expr, message) -> None:
    shapes = {"A": [4, 3], "B": [3, 5], "bias": [5]}
    path = tmp_path / "op.json"
    path.write_text(json.dumps({"expr": expr, "shapes": {t: s for t, s in shapes.items() if f"{t}[" in expr}}))
    rc, _out, err = cli(capsys, "op", "check", str(path))
    assert rc == 2 and message in err and "second op" in err


@pytest.mark.parametrize("expr", [
    "Y[m,n] += A[m,k]*B[k,n]*bias[n]", "Y[m,n] += (A[m,k] + bias[m]) * B[k,n]", "Y[m,n] += relu(A[m,k]) * B[k,n]",
    "Y[m,n] += exp(A[m,k]) + B[k,n]", "Y[m,n] max= A[m,k]*B[k,n] + bias[n]", "Y[m,n] += -A[m,k]*B[k,n]",
])
def test_plus_equals_bodies_with_one_reading_are_accepted(tmp_path, capsys, expr) -> None:
    shapes = {"A": [4, 3], "B": [3, 5], "bias": [4] if "bias[m]" in expr else [5]}
    path = tmp_path / "op.json"
    path.write_text(json.dumps({"expr": expr, "shapes": {t: s for t, s in shapes.items() if f"{t}[" in expr}}))
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(path), "--check", "--no-cache")
    assert rc == 0 and "check ok" in out, err


def test_readme_documents_the_grammar() -> None:
    # The op.json grammar moved out of README.md into docs/opjson.md (float16 on OpenCL included); the README
    # links to it. The test keeps its name so that `-k readme` still selects it.
    doc = (ROOT / "docs" / "opjson.md").read_text()
    for needle in ("count_include_pad", "extents", "Index notation", "axis value", "broadcast",
                   "relu(Y[m,n])", "cl_khr_fp16"):
        assert needle in doc, needle
    assert "docs/opjson.md" in (ROOT / "README.md").read_text(), "README.md must link the grammar"


# ---- 9: average pooling's divisor -----------------------------------------------------------------------------------

def _avg_loop(x: np.ndarray, k: int, stride: int, before: int, out: tuple[int, int], include_pad: bool) -> np.ndarray:
    n, c, h, w = x.shape
    y = np.zeros((n, c) + out)
    for i in range(out[0]):
        for j in range(out[1]):
            h0, w0 = i * stride - before, j * stride - before
            win = x[:, :, max(h0, 0):max(min(h0 + k, h), 0), max(w0, 0):max(min(w0 + k, w), 0)]
            total = win.sum(axis=(2, 3))
            y[:, :, i, j] = total / (k * k if include_pad else win.shape[2] * win.shape[3])
    return y


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("h,k,stride,padding,before", [(7, 3, 2, 1, 1), (9, 3, 1, 1, 1), (8, 2, 2, 1, 1),
                                                        (6, 3, 3, 2, 2), (10, 4, 2, 2, 2)])
def test_avgpool_divisor(include, h, k, stride, padding, before) -> None:
    doc = {"name": "ap", "op": "avgpool2d", "N": 1, "C": 2, "H": h, "W": h, "K": k, "stride": stride,
           "padding": padding, "count_include_pad": include}
    op = load_op(doc)
    x = random_inputs(op, seed=0)
    want = _avg_loop(x["X"].astype(np.float64), k, stride, before, op.output.shape[2:], include)
    np.testing.assert_allclose(reference(op, x), want, rtol=1e-6, atol=1e-7)
    y = roller.compile(op, hw="pocl-cpu", cache=False, top_k=1)(**x)
    check_against("ap", op, x, y)


def test_avgpool_default_is_unchanged() -> None:
    a = load_op({"op": "avgpool2d", "N": 1, "C": 1, "H": 5, "W": 5, "K": 3, "padding": 1})
    b = load_op({"op": "avgpool2d", "N": 1, "C": 1, "H": 5, "W": 5, "K": 3, "padding": 1, "count_include_pad": True})
    assert a.statement() == b.statement() and a.statement().endswith("/ 9.0")


def test_avgpool_windows_wholly_in_padding(tmp_path, capsys) -> None:
    path = tmp_path / "op.json"
    path.write_text(json.dumps({"op": "avgpool2d", "N": 1, "C": 1, "H": 5, "W": 5, "K": 2, "stride": 2,
                                "padding": 2, "count_include_pad": False}))
    rc, _out, err = cli(capsys, "op", "check", str(path))
    assert rc == 2 and "averages a window with no input point" in err


# ---- 10: float16 and bfloat16 on OpenCL --------------------------------------------------------------------------------

def half_ops(dtype: str, tag: str) -> list[dict]:
    """Ops that hold ``dtype`` tensors: a matmul, one with a single such input, a convolution, a pooling, an
    elementwise op, and a float32 sum stored as ``dtype``."""
    return [matmul(f"mm{tag}", 33, 20, 70) | {"dtype": dtype},
            matmul(f"mixed{tag}", 33, 20, 70) | {"dtypes": {"A": dtype}},
            conv(f"cv{tag}", 3, 9, 4, 3) | {"dtype": dtype},
            {"name": f"mp{tag}", "op": "maxpool2d", "N": 1, "C": 3, "H": 9, "W": 9, "K": 3, "dtype": dtype},
            {"name": f"re{tag}", "op": "elementwise", "fn": "relu", "shapes": {"X": [100]}, "dtype": dtype},
            {"name": f"out{tag}", "expr": "Y[i] += X[i,k] * 3", "shapes": {"X": [5, 9]}, "dtypes": {"Y": dtype}}]


F16, BF16 = half_ops("float16", "16"), half_ops("bfloat16", "bf16")


@pytest.mark.parametrize("doc", F16, ids=lambda d: d["name"])
@pytest.mark.parametrize("hw", ["pocl-cpu", "mi50", "ipu-gc200"])
def test_float16_runs_on_opencl(doc, hw) -> None:
    op = load_op(doc)
    k = roller.compile(op, hw=hw, backend="opencl", cache=False, top_k=1)
    code = "\n".join(line.split("//")[0] for line in k.source.splitlines())
    # no half type at all: float16 bits are converted with integer operations, so no cl_khr_fp16 is needed
    assert re.findall(r"\bhalf\d*\b", code) == [] and "rl_h2f" in code
    x = random_inputs(op, seed=0)
    y = k(**x)
    assert y.dtype == np.dtype(np.float16 if op.output.dtype == "float16" else np.float32)
    check_against(op.name, op, x, y)


def test_the_device_here_lacks_cl_khr_fp16() -> None:
    """What makes the float16 tests above meaningful: the kernels ran without the extension."""
    from roller.backends.opencl.launcher import pick_device

    assert "cl_khr_fp16" not in pick_device().extensions


@pytest.mark.parametrize("doc", BF16, ids=lambda d: d["name"])
@pytest.mark.parametrize("hw", ["pocl-cpu", "mi50", "ipu-gc200"])
def test_bfloat16_runs_on_opencl(doc, hw) -> None:
    """bfloat16 tensors are held as their bits too (OpenCL C has no type for them), each value the upper half
    of a float's, stores rounded to nearest even: the same ops within bfloat16's error bound."""
    op = load_op(doc)
    k = roller.compile(op, hw=hw, backend="opencl", cache=False, top_k=1)
    assert "rl_bf2f" in k.source
    x = random_inputs(op, seed=0)
    y = k(**x)
    assert y.dtype == np.dtype(np.float32)   # bfloat16's host type
    if op.output.dtype == "bfloat16":   # every value a bfloat16 number
        assert not (y.view(np.uint32) & np.uint32(0xFFFF)).any()
    check_against(op.name, op, x, y)


@pytest.mark.parametrize("n", [7, 1000])   # a scalar kernel, a vectorised one
def test_bfloat16_stores_round_as_ml_dtypes(n: int) -> None:
    """float32 -> bfloat16 in a kernel, bit for bit as ml_dtypes (what onnx converts with) rounds: to nearest,
    ties to even, NaN quiet with its sign, infinities and overflow to infinity, subnormals kept."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    # ties (to 1.0 below, up to 1 + 2^-6 above), past a tie, overflow, NaN, -0, a subnormal; then the rest
    special = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, 3.4e38, -np.nan, -0.0, 1e-40,
                        0.0, np.inf, -np.inf, np.nan, -3.4e38, -1e-45], np.float32)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x[:min(n, special.size)] = special[:n]
    x.view(np.uint32)[-1] = 0x7F800001   # a NaN whose payload is in the half a store drops
    op = load_op({"name": f"tobf16_{n}", "expr": "Y[i] = X[i]", "shapes": {"X": [n]}, "dtypes": {"Y": "bfloat16"}})
    y = roller.compile(op, hw="pocl-cpu", backend="opencl", cache=False, top_k=1)(X=x)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    real = ~np.isnan(want)
    assert np.array_equal(y.view(np.uint32)[real], want.view(np.uint32)[real])
    assert np.array_equal(np.signbit(y), np.signbit(want))


@pytest.mark.parametrize("backend,hw", [("hip", "mi50")])
def test_bfloat16_is_rejected_where_there_is_no_type(tmp_path, capsys, backend, hw) -> None:
    path = tmp_path / "op.json"
    path.write_text(json.dumps(matmul("bf", 8, 8, 8) | {"dtype": "bfloat16"}))
    rc, _out, err = cli(capsys, "build", "--hw", hw, "--backend", backend, str(path), "-o", str(tmp_path / "o"))
    assert rc == 2 and f"the {backend} backend does not render bfloat16 tensors" in err and err.count("\n") == 1
