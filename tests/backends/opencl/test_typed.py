"""Typed bodies rendered (issue 37): integer and bool ops built by the C-family plan (plan/typed.py) run on PoCL
and match the reference exactly, on every candidate, with the CPU's direct reads and the GPUs' staged tiles
alike; their CUDA and HIP sources compile. Edge cases the C language leaves undefined (overflow, x / 0,
MIN / -1, NaN and out-of-range casts) give what roller.ir.typed_eval defines."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.compiler.check import check_against
from roller.errors import ToolchainError
from roller.hw import load
from tests.support.candidates import opencl_candidates

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
I32 = np.iinfo(np.int32)


def _op(name: str, expr: str, shapes: dict[str, list[int]], **dtypes: str) -> dict:
    return {"name": name, "expr": expr, "shapes": shapes, "dtypes": dtypes}


OPS = [
    _op("pick", "Y[i] = where(gt(X[i], 0.0), ids[i] / 3, -ids[i])", {"X": [100], "ids": [100]}, ids="int64",
        Y="int64"),
    _op("rowsum8", "Y[i] += X[i,k]", {"X": [50, 37]}, X="int8", Y="int8"),
    _op("causal", "Y[i,j] = le(j, i)", {"Y": [40, 40]}, Y="bool"),
    _op("quantise", "Y[i] = int8(X[i] * 100.0)", {"X": [64]}, Y="int8"),
    _op("maxprod", "Y[i] max= A[i,k] * B[k]", {"A": [33, 70], "B": [70]}, A="int32", B="int32", Y="int32"),
    _op("mixed", "Y[i] = float32(xor(M[i], gt(A[i], 0))) + A[i] / 7", {"M": [90], "A": [90]}, M="bool",
        A="int32"),
    _op("imatmul", "Y[m,n] += A[m,k] * B[k,n]", {"A": [64, 48], "B": [48, 32]}, A="int64", B="int64",
        Y="int64"),
    _op("arith", "Y[i] = A[i] / B[i] + A[i] * B[i] - abs(A[i])", {"A": [200], "B": [200]}, A="int32",
        B="int32", Y="int32"),
    _op("narrow", "Y[i] = uint8(A[i]) + uint8(3)", {"A": [64]}, A="int64", Y="uint8"),
    _op("isfin", "Y[i] = not(or(isnan(X[i]), isinf(X[i])))", {"X": [8]}, Y="bool"),
    _op("embed", "Y[i,d] = E[ids[i], d] * 2.0", {"E": [50, 24], "ids": [30], "Y": [30, 24]}, ids="int64"),
    _op("columns", "Y[b,j] = X[b, idx[j] + 1] + 1", {"X": [6, 40], "idx": [17], "Y": [6, 17]}, X="int32",
        idx="int32", Y="int32"),
    _op("shifted", "Y[i,j] = X[ids[i], j - 1] + 1.0", {"X": [7, 5], "ids": [3], "Y": [3, 5]}, ids="int32"),
    _op("maskpick", "Y[i,j] = M[pos[i,j], j]", {"M": [9, 12], "pos": [5, 12], "Y": [5, 12]}, M="bool", pos="int8",
        Y="bool"),
]


def _inputs(op: dict, seed: int) -> dict[str, np.ndarray]:
    x = roller.random_inputs(op, seed=seed)
    if op["name"] in ("quantise", "isfin"):
        n = len(x["X"])
        x["X"] = np.concatenate([np.random.default_rng(seed).standard_normal(n - 4) * 2,
                                 [np.nan, np.inf, -np.inf, 1.275]]).astype(np.float32)
    if op["name"] in ("embed", "columns", "maskpick", "shifted"):   # in range, from the end, outside (clamped)
        key = {"embed": "ids", "columns": "idx", "maskpick": "pos", "shifted": "ids"}[op["name"]]
        n = {"embed": 50, "columns": 40, "maskpick": 9, "shifted": 7}[op["name"]]
        rng = np.random.default_rng(seed)
        x[key] = rng.integers(-n - 3, n + 3, x[key].shape).astype(x[key].dtype)
        flat = x[key].reshape(-1)
        flat[:4] = [0, n - 1, -1, n][:flat.size]
    if op["name"] == "arith":   # MIN / -1, x / 0 and a truncating quotient, with wrapping products around
        x["A"][:4], x["B"][:4] = [I32.min, 7, -7, I32.max], [-1, 0, 2, I32.max]
    return x


@needs_device
@pytest.mark.parametrize("hw", ["pocl-cpu", "h100", "mi50"])
def test_every_candidate_of_typed_ops_runs_exactly_on_pocl(hw: str) -> None:
    checked = 0
    for op in OPS:
        expr = roller.load_op(op)
        x = _inputs(op, seed=2)
        for prog, _, out in opencl_candidates(op, hw, x, top_k=10):
            check_against(f"{op['name']} on {hw} ({prog.line()})", expr, x, out)
            checked += 1
    assert checked >= len(OPS)


@needs_device
def test_typed_kernels_through_roller_compile() -> None:
    for op in OPS:
        k = roller.compile(op, hw="pocl-cpu")
        x = _inputs(op, seed=5)
        out = k(**x)
        assert out.dtype == roller.reference(op, x).dtype
        np.testing.assert_array_equal(out, roller.reference(op, x))


def test_typed_sources_print_their_semantics() -> None:
    src = roller.compile(OPS[7], hw="pocl-cpu").source
    assert "rl_div_int32" in src and "(uint)" in src    # a guarded division, products through unsigned
    quantise = roller.compile(OPS[3], hw="pocl-cpu").source
    assert "rl_f2int8" in quantise and "x != x" in quantise   # saturating conversion, NaN to 0
    assert "rl_div" not in roller.compile({"op": "matmul", "M": 8, "N": 8, "K": 8}, hw="pocl-cpu").source


@pytest.mark.parametrize("hw,backend", [("h100", "cuda"), ("mi50", "hip")])
def test_typed_sources_compile_for_gpus(hw: str, backend: str) -> None:
    be, desc = get(backend), load(hw)
    with tempfile.TemporaryDirectory() as tmp:
        for op in OPS:
            prog = roller.construct(op, hw, top_k=1)[0]
            try:
                be.check_compiles(be.render(prog, desc), desc, Path(tmp) / op["name"])
            except ToolchainError as err:
                pytest.skip(str(err))
