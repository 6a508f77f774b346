"""Generated HIP kernels, unchanged, run on CPU threads (roller/backends/rocm_hip/emulate.py) and match
roller.reference: the whole scaled suite as built for MI50, float16 kernels on the vector path, and MFMA kernels
of both instruction shapes with one and several instruction tiles per wavefront, on every GEMM layout
(transposes, batch, implicit-GEMM convolution). The MFMA builtins are emulated from AMD's documented lane
layouts, written as the inverse of what the kernel template computes, so a wrong fragment load or result
store shows up as a wrong answer (the negative control below proves it does)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import roller.hw as H
from roller.backends import Artifact, get
from roller.backends.rocm_hip import emulate
from roller.compiler.check import check_against
from roller.construction import construct, matrix_candidates
from roller.errors import CheckError, ToolchainError
from roller.ir import load_ops
from roller.ir.reference import random_inputs

ROOT = Path(__file__).resolve().parents[3]
BACKEND = get("hip")


def _missing() -> str:
    try:
        emulate.compiler()
        return ""
    except ToolchainError as err:
        return str(err)


pytestmark = pytest.mark.skipif(bool(_missing()), reason=_missing() or "clang++ present")


def check(op, art: Artifact, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    x = random_inputs(op, seed=3)
    y = emulate.run(art, [x[t.name] for t in op.inputs], tmp)
    check_against(f"{op.name}: {art.launch['rprogram']}", op, x, y)


@pytest.mark.slow
def test_scaled_suite_built_for_mi50_runs_right(tmp_path: Path) -> None:
    hw = H.load("mi50")
    ops = load_ops(ROOT / "bench/suites/scaled.json")

    def one(op):  # type: ignore[no-untyped-def]
        check(op, BACKEND.render(construct(op, hw, top_k=1)[0], hw), tmp_path / op.name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, ops))


def test_float16_vector_path(tmp_path: Path) -> None:
    """_Float16 loads, float accumulation and the -inf pad of max pooling, on MI50 (no matrix cores)."""
    hw = H.load("mi50")
    ops = load_ops({"ops": [
        {"op": "maxpool2d", "N": 1, "C": 5, "H": 9, "W": 9, "K": 3, "stride": 2, "padding": "SAME",
         "dtype": "float16", "name": "pool"},
        {"op": "elementwise", "fn": "exp", "shapes": {"X": [7, 33]}, "dtype": "float16", "name": "ex"},
        {"op": "reduce", "kind": "mean", "shape": [6, 40], "axes": [1], "dtype": "float16", "name": "mean"},
        {"op": "matmul", "M": 33, "N": 17, "K": 29, "dtype": "float16", "name": "mm"}]})
    for op in ops:
        check(op, BACKEND.render(construct(op, hw, top_k=1)[0], hw), tmp_path / op.name)


MFMA_OPS = load_ops({"ops": [
    {"op": "matmul", "M": 150, "N": 130, "K": 40, "dtype": "float16", "name": "mm"},
    {"op": "matmul", "M": 64, "N": 80, "K": 48, "transpose_a": True, "dtype": "float16", "name": "mm_ta"},
    {"op": "matmul", "M": 64, "N": 80, "K": 48, "transpose_b": True, "dtype": "float16", "name": "mm_tb"},
    {"op": "batch_matmul", "B": 3, "M": 64, "N": 48, "K": 40, "dtype": "float16", "name": "bmm"},
    {"op": "conv2d", "N": 2, "C": 16, "H": 14, "W": 14, "F": 32, "KH": 3, "KW": 3, "dtype": "float16",
     "name": "conv"},
    {"op": "conv2d", "N": 1, "C": 8, "H": 12, "W": 12, "F": 40, "KH": 3, "KW": 3, "stride": 2, "padding": "SAME",
     "layout": "NHWC", "dtype": "float16", "name": "conv_nhwc"}]})


def coverage(op, hw) -> list:  # type: ignore[no-untyped-def]
    """One program per (instruction, several tiles along m, several along n) that the search offers."""
    seen, out = set(), []
    for p in matrix_candidates(op, hw, BACKEND.matrix_support, want=1000, every_tiling=True):
        m = BACKEND.render(p, hw).extra["mfma"]
        key = (m.instruction.name, m.m_tiles > 1, m.n_tiles > 1)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


@pytest.mark.slow
def test_mfma_layouts_on_every_gemm_shape(tmp_path: Path) -> None:
    hw = H.load("mi250x")
    kinds = set()
    jobs = []
    for op in MFMA_OPS:
        progs = coverage(op, hw) if op.name == "mm" else matrix_candidates(op, hw, BACKEND.matrix_support, want=1)
        for i, p in enumerate(progs):
            art = BACKEND.render(p, hw)
            m = art.extra["mfma"]
            kinds.add((m.im, m.m_tiles > 1, m.n_tiles > 1))
            jobs.append((op, art, tmp_path / f"{op.name}-{i}"))
    # both instructions, each with one and with several instruction tiles per wavefront along m and n
    assert {(32, False, False), (32, True, True), (16, False, False), (16, True, False), (16, False, True)} <= kinds
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda j: check(*j), jobs))


def test_mfma_on_mi100_and_mi300x(tmp_path: Path) -> None:
    op = MFMA_OPS[0]
    for device in ("mi100", "mi300x"):
        hw = H.load(device)
        check(op, BACKEND.render(matrix_candidates(op, hw, BACKEND.matrix_support, want=1)[0], hw), tmp_path / device)


def test_a_wrong_result_layout_is_caught(tmp_path: Path) -> None:
    """Negative control: permuting the rows a lane stores within its group of four gives wrong answers."""
    hw = H.load("mi250x")
    op = MFMA_OPS[0]
    art = BACKEND.render(matrix_candidates(op, hw, BACKEND.matrix_support, want=1)[0], hw)
    assert "+ rl_v % 4;" in art.source
    bad = Artifact(art.kernel_name, {art.main_file: art.source.replace("+ rl_v % 4;", "+ (3 - rl_v % 4);")},
                   art.launch, main_file=art.main_file)
    with pytest.raises(CheckError):
        check(op, bad, tmp_path)


def test_kernels_with_runtime_extents_run_right_below_the_greatest_size(tmp_path: Path) -> None:
    """HIP kernels that take the sequence length as an argument (attention's scores and context), built for
    512 and run at 1, 17 and 100 on the blocks covering them, NaN in the layout's padding."""
    import roller

    rng = np.random.default_rng(5)
    for doc in ({"name": "scores", "expr": "Y[q,k] += Q[q,d] * K[d,k]", "shapes": {"Q": ["s", 32], "K": [32, "s"]},
                 "symbols": {"s": [1, 512]}},
                {"name": "context", "expr": "Y[q,d] += P[q,k] * V[k,d]", "shapes": {"P": ["s", "s"], "V": ["s", 32]},
                 "symbols": {"s": [1, 512]}}):
        k = roller.compile(doc, hw="mi100")
        assert k.mode == "generic" and k.kernels.scalar_args, k.why
        for n in (1, 17, 100):
            i = k.kernels.choose(n)
            big = k.kernels.source(512)
            small = k.op.instantiate({"s": n})
            x = {t.name: rng.standard_normal(t.storage_shape).astype(np.float32) for t in small.inputs}
            padded = []
            for t in big.inputs:
                a = np.full(t.storage_shape, np.nan, np.float32)
                a[tuple(slice(0, d) for d in x[t.name].shape)] = x[t.name]
                padded.append(a)
            y = emulate.run(k.artifacts[i], padded, tmp_path / f"{doc['name']}{n}", grid=k.kernels.blocks(i, n),
                        scalars=k.kernels.scalars(n))
            got = y.reshape(big.output.storage_shape)[tuple(slice(0, d) for d in small.output.storage_shape)]
            check_against(f"{doc['name']} at s={n}: {k.artifacts[i].launch['rprogram']}", small, x, got)


def test_float64_kernels(tmp_path: Path) -> None:
    """float64 ops compute in double (issue 40): a matmul staged through LDS, a row kernel, a vectorisable
    elementwise body with literals, and a typed body, built for MI50, within float64's rounding bound."""
    hw = H.load("mi50")
    ops = load_ops({"ops": [
        {"op": "matmul", "M": 40, "N": 36, "K": 50, "dtype": "float64", "name": "mm"},
        {"expr": "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
         "shapes": {"X": [9, 50]}, "dtype": "float64", "name": "softmax"},
        {"expr": "Y[i,j] = exp(X[i,j] * 0.1) + j", "shapes": {"X": [33, 20]}, "dtype": "float64", "name": "ew"},
        {"expr": "Y[i] = float64(ids[i]) * 0.5 + X[i]", "shapes": {"ids": [64], "X": [64]}, "dtype": "float64",
         "dtypes": {"ids": "int64"}, "name": "ids"}]})
    for op in ops:
        art = BACKEND.render(construct(op, hw, top_k=1)[0], hw)
        assert "double" in art.source
        check(op, art, tmp_path / op.name)
