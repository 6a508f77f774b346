"""Generated CUDA kernels run on the CPU through a small CUDA stand-in (tests/backends/cuda/cuda_emu/cuda_emu.h: one
std::thread per CUDA thread, barriers, and wmma fragments that hold whole tiles), checked against
roller.reference. No GPU here: this checks what the kernels compute with -- the staging, the fragment
layouts, leading dimensions and offsets, the per-warp epilogue, the guards -- not the hardware's wmma."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import roller
import roller.hw as H
from roller.backends import get
from roller.compiler.check import check_against
from roller.construction import construct
from roller.ir import load_ops
from roller.ir.reference import random_inputs
from tests.backends.cuda.emulator import CXX, compile_driver, kernel_source, loads_and_args, run_on

CUDA = get("cuda")
pytestmark = pytest.mark.skipif(CXX is None, reason="g++ is not installed")
NP = {"float32": np.float32, "float16": np.float16}

DRIVER = """#include "cuda_emu.h"
#include <cstdio>
{kernel}
int main(int argc, char** argv) {{
{loads}
    emu_launch({name}, {grid}, {block}, {args});
    FILE* f = std::fopen(argv[{nout}], "wb"); std::fwrite(out, sizeof(*out), {out_elems}, f); std::fclose(f);
    return 0;
}}
"""


def run_emulated(art, tmp: Path) -> Path:  # type: ignore[no-untyped-def]
    specs = art.launch["arguments"]
    loads, args = loads_and_args(specs)
    return compile_driver(DRIVER.format(kernel=kernel_source(art), loads=loads, name=art.kernel_name,
                                        grid=art.launch["grid"][0], block=art.launch["block"][0], args=args,
                                        nout=len(specs), out_elems=int(np.prod(specs[-1]["shape"]))), tmp)


@pytest.mark.parametrize("spec", [
    {"op": "matmul", "M": 37, "N": 45, "K": 40},
    {"op": "matmul", "M": 40, "N": 24, "K": 33, "transpose_a": True},
    {"op": "matmul", "M": 24, "N": 40, "K": 50, "transpose_b": True},
    {"op": "batch_matmul", "B": 2, "M": 20, "N": 33, "K": 24},
    {"op": "conv2d", "N": 1, "C": 8, "H": 6, "W": 5, "F": 20, "KH": 3, "KW": 3},
    {"op": "conv2d", "N": 2, "C": 16, "H": 5, "W": 5, "F": 8, "KH": 3, "KW": 3, "stride": 2, "layout": "NHWC"},
    # rows of whole 16-byte vectors: staged with uint4 loads, the tiles past M's and N's ends zero-filled
    {"op": "matmul", "M": 40, "N": 48, "K": 64},
    {"op": "matmul", "M": 24, "N": 40, "K": 48, "transpose_b": True},
    {"op": "conv2d", "N": 1, "C": 8, "H": 6, "W": 5, "F": 24, "KH": 1, "KW": 1},
])
def test_wmma_kernels_match_reference(spec: dict, tmp_path: Path) -> None:
    op = load_ops(dict(spec, dtype="float16"))[0]
    hw = H.load("h100")
    progs = [p for p in construct(op, hw, top_k=10, matrix=get("cuda").matrix_support) if p.use_matrix and p.grid * p.block <= 4096]
    assert progs, "no small matrix program to emulate"
    x = random_inputs(op, seed=3)
    ref = roller.reference(op, x)
    for i, p in enumerate(progs[:2]):
        art = CUDA.render(p, hw)
        folder = tmp_path / str(i)
        folder.mkdir()
        y = run_on(run_emulated(art, folder), op, x, folder, np.float16)
        check_against(p.line(), op, x, y.reshape(ref.shape))


@pytest.mark.parametrize("spec,vectors", [
    ({"op": "matmul", "M": 40, "N": 48, "K": 64}, {"A", "B"}),
    ({"op": "matmul", "M": 24, "N": 40, "K": 48, "transpose_b": True}, {"A", "B"}),
    ({"op": "conv2d", "N": 1, "C": 8, "H": 6, "W": 5, "F": 24, "KH": 1, "KW": 1}, {"W"}),   # X: an im2col view
])
def test_whole_vector_rows_stage_as_vectors(spec: dict, vectors: set[str]) -> None:
    """The tensors above whose rows are whole 16-byte vectors stage with uint4 loads (what the emulation then
    runs); a view, or a tensor whose rows are not (B of 37x45x40: 45 halves), stages element by element."""
    hw = H.load("h100")
    op = load_ops(dict(spec, dtype="float16"))[0]
    progs = [p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support) if p.use_matrix]
    assert progs
    for p in progs:
        staged = {m.group(1): "8 elements a load" in m.group(0)
                  for m in re.finditer(r"// stage (\w+):.*", CUDA.render(p, hw).source)}
        assert {t for t, v in staged.items() if v} == vectors, (p.line(), staged)
    odd = load_ops({"op": "matmul", "M": 37, "N": 45, "K": 40, "dtype": "float16"})[0]
    for p in construct(odd, hw, top_k=10, matrix=CUDA.matrix_support):
        src = CUDA.render(p, hw).source
        assert all("elements a load" not in line for line in re.findall(r"// stage B:.*", src))


def test_emulation_catches_a_wrong_fragment_layout(tmp_path: Path) -> None:
    """Negative control: the same kernel with matrix_a's layout flipped must disagree with the reference."""
    op = load_ops({"op": "matmul", "M": 32, "N": 32, "K": 32, "dtype": "float16"})[0]
    hw = H.load("h100")
    p = next(p for p in construct(op, hw, top_k=10, matrix=get("cuda").matrix_support) if p.use_matrix)
    art = CUDA.render(p, hw)
    a_layout = art.extra["matrix"].a_layout
    flipped = "col_major" if a_layout == "row_major" else "row_major"
    art.files[art.main_file] = art.source.replace(f"__half, nvcuda::wmma::{a_layout}> rl_frag_a",
                                                  f"__half, nvcuda::wmma::{flipped}> rl_frag_a")
    assert art.source.count(f"{flipped}> rl_frag_a") == 1
    x = random_inputs(op, seed=3)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float16).reshape(32, 32).astype(np.float32)
    assert not np.allclose(y, roller.reference(op, x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("spec", [
    {"op": "matmul", "M": 37, "N": 45, "K": 40, "dtype": "float64"},
    {"expr": "Y[i,j] = exp(X[i,j] * 0.1) + j", "shapes": {"X": [33, 20]}, "dtype": "float64", "name": "ew"},
])
def test_float64_kernels_match_reference(spec: dict, tmp_path: Path) -> None:
    """float64 ops compute in double (issue 40), staged tiles included, within float64's rounding bound."""
    op = load_ops(spec)[0]
    hw = H.load("h100")
    p = next(p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support) if p.grid * p.block <= 4096)
    art = CUDA.render(p, hw)
    assert "double" in art.source
    x = random_inputs(op, seed=3)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float64)
    check_against(p.line(), op, x, y.reshape(op.output.shape))


PIPELINED = [{"op": "matmul", "M": 72, "N": 80, "K": 256},                       # M past the block: zero-filled rows
             {"op": "matmul", "M": 64, "N": 48, "K": 320, "transpose_b": True}]


def _pipelined(spec: dict, stages: int):  # type: ignore[no-untyped-def]
    """(op, program, artifact): the small matrix program of ``spec`` with the shallowest reduction step (the most
    steps: the ring must wrap), rendered as a ``stages``-deep ring."""
    op = load_ops(dict(spec, dtype="float16"))[0]
    hw = H.load("h100")
    progs = [p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support)
             if p.use_matrix and p.grid * p.block <= 4096]
    assert progs, "no small matrix program to emulate"
    p = dataclasses.replace(min(progs, key=lambda p: p.block_tile.shape[-1]), stages=stages)
    art = CUDA.render(p, hw)
    assert art.launch.get("stages") == stages, "every staged tile here is in whole 16-byte rows: it must pipeline"
    steps = art.extra["plan"].n_rtiles
    assert steps >= 2 * stages, f"{steps} steps do not wrap a ring of {stages} twice"
    return op, p, art


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("spec", PIPELINED)
def test_pipelined_kernels_match_reference(spec: dict, stages: int, tmp_path: Path) -> None:
    """The cp.async ring (copies land only at their wait, poisoned until then) computes what numpy does."""
    op, p, art = _pipelined(spec, stages)
    assert art.source.count("__syncthreads();") == 1, "one barrier a step"
    assert f"rl_cp_async_wait<{stages - 2}>();" in art.source
    x = random_inputs(op, seed=5)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float16)
    check_against(p.line(), op, x, y.reshape(op.output.shape))


def _wait_short(src: str) -> str:
    """The step's wait one group short: it returns before the step's own copies have landed."""
    return src.replace("rl_cp_async_wait<1>();", "rl_cp_async_wait<2>();")


def _prefetch_before_barrier(src: str) -> str:
    """The prefetch issued before the barrier: it overwrites the slot that slower warps still read for the
    previous step (a write-after-read race)."""
    pattern = re.compile(r"(        rl_cp_async_wait<1>\(\);\n)(        __syncthreads\(\);\n)(        \{\n.*?"
                         r"            rl_cp_async_commit\(\);\n        \}\n)", re.DOTALL)
    return pattern.sub(r"\1\3\2", src)


@pytest.mark.parametrize("broken", [_wait_short, _prefetch_before_barrier])
def test_emulation_catches_a_broken_pipeline(broken, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Negative controls: each ordering bug, edited into a correct 3-stage kernel, must give wrong outputs
    (the poisoned, not yet landed slots are read), so the emulation above can see such bugs."""
    op, _, art = _pipelined(PIPELINED[0], 3)
    src = broken(art.source)
    assert src != art.source, "the edit must apply"
    art.files[art.main_file] = src
    x = random_inputs(op, seed=5)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float16).astype(np.float32)
    ref = roller.reference(op, x)
    assert np.isnan(y).any() and not np.allclose(y.reshape(ref.shape), ref, rtol=1e-2, atol=1e-2)


SHARED_VECTOR = [{"op": "matmul", "M": 37, "N": 72, "K": 40},                  # tiles past M's end, K's last step partial
                 {"op": "matmul", "M": 40, "N": 36, "K": 24, "transpose_a": True},  # A[k, m]: runs along m too
                 {"op": "matmul", "M": 24, "N": 40, "K": 48, "transpose_b": True},  # both read along k
                 {"op": "batch_matmul", "B": 2, "M": 20, "N": 48, "K": 24},
                 {"op": "matmul", "M": 40, "N": 48, "K": 256}]                  # long enough for a ring


def _shared_vector_programs(spec: dict, top_k: int = 30):  # type: ignore[no-untyped-def]
    op = load_ops(dict(spec, dtype="float32"))[0]
    hw = H.load("h100")
    progs = [p for p in construct(op, hw, top_k=top_k) if p.shared_vector > 1 and p.grid * p.block <= 4096]
    return op, hw, progs


@pytest.mark.parametrize("spec", SHARED_VECTOR)
def test_shared_vector_kernels_match_reference(spec: dict, tmp_path: Path) -> None:
    """Scalar float32 programs that read their staged rows in 16-byte vectors (issue 41 step 3: rows padded to
    odd numbers of vectors, threads owning runs of 4 along the rows' axis), with and without a ring, compute
    what numpy does: the runs' decode in the inner product and in the epilogue cover every output once."""
    op, hw, progs = _shared_vector_programs(spec)
    assert progs, "no small program reads its staged rows in vectors"
    runs = [p for p in progs if "* 4 + (rl_j" in CUDA.render(p, hw).source]
    chosen = ([runs[0]] if runs else []) + [p for p in progs if p not in runs][:1]
    if spec.get("K", 0) >= 256:
        chosen = [dataclasses.replace(chosen[0], stages=3)]
    x = random_inputs(op, seed=7)
    for i, p in enumerate(chosen):
        art = CUDA.render(p, hw)
        assert "__align__(16)" in art.source or art.launch["dynamic_shared_bytes"], "vector reads need 16-byte rows"
        assert art.launch.get("stages", 1) == p.stages, "whole-vector rows: the ring renders as constructed"
        folder = tmp_path / str(i)
        folder.mkdir()
        y = run_on(run_emulated(art, folder), op, x, folder, np.float32)
        check_against(p.line(), op, x, y.reshape(op.output.shape))


@pytest.mark.parametrize("spec", [{"op": "matmul", "M": 70, "N": 136, "K": 40},
                                  {"op": "matmul", "M": 64, "N": 256, "K": 64, "transpose_a": True}])
def test_warp_ordered_kernels_match_reference(spec: dict, tmp_path: Path) -> None:
    """Blocks of whole warps whose threads own runs take their coordinates from a permuted thread index (each
    warp 8 runs wide and 4 rows deep, schedule.warp_order): every thread still computes a distinct part."""
    op, hw, progs = _shared_vector_programs(spec, top_k=60)
    p = next(p for p in progs if "rl_tw" in CUDA.render(p, hw).source)
    art = CUDA.render(p, hw)
    x = random_inputs(op, seed=11)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float32)
    check_against(p.line(), op, x, y.reshape(op.output.shape))


def test_emulation_catches_overlapping_runs(tmp_path: Path) -> None:
    """Negative control: runs spaced one thread count apart instead of ``threads`` x 4 overlap (two threads
    compute one point, another none), which the emulation must see."""
    op, hw, progs = _shared_vector_programs(SHARED_VECTOR[0])
    p = next(p for p in progs if "* 4 + (rl_j" in CUDA.render(p, hw).source)
    art = CUDA.render(p, hw)
    threads = next(ax.threads for ax in art.extra["plan"].spatial if ax.run > 1)
    src = art.source.replace(f") * {threads * 4};", f") * {threads};")
    assert src != art.source
    art.files[art.main_file] = src
    x = random_inputs(op, seed=7)
    y = run_on(run_emulated(art, tmp_path), op, x, tmp_path, np.float32)
    assert not np.allclose(y.reshape(op.output.shape), roller.reference(op, x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("spec", [
    {"op": "conv2d", "N": 2, "C": 6, "H": 9, "W": 7, "F": 10, "KH": 3, "KW": 3},
    {"op": "conv2d", "N": 1, "C": 5, "H": 11, "W": 10, "F": 8, "KH": 3, "KW": 3, "stride": 2},
    {"op": "conv2d", "N": 2, "C": 12, "H": 6, "W": 6, "F": 8, "KH": 1, "KW": 1},
])
def test_gathers_staged_along_their_contiguous_run_match_reference(spec: dict, tmp_path: Path) -> None:
    """An NCHW convolution's im2col view is staged with consecutive threads along n*h*w (w contiguous in the
    source), each thread's coordinate of it fixed (schedule.stage_order, DimPlan.per_thread): float32 scalar
    programs and float16 wmma ones compute what numpy does."""
    hw = H.load("h100")
    for dtype in ("float32", "float16"):
        op = load_ops(dict(spec, dtype=dtype))[0]
        progs = [p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support) if p.grid * p.block <= 4096]
        p = next(p for p in progs if re.search(r"// stage X.*\n.*\n\s+const int rl_d0 = \(rl_\w+ / 1\) %",
                                               CUDA.render(p, hw).source))
        art = CUDA.render(p, hw)
        x = random_inputs(op, seed=13)
        folder = tmp_path / dtype
        folder.mkdir()
        y = run_on(run_emulated(art, folder), op, x, folder, NP[dtype])
        check_against(p.line(), op, x, y.reshape(op.output.shape))


def test_stage_order_walks_the_view_dimension_with_fewer_sectors() -> None:
    """NCHW: n*h*w first (w contiguous, or every other element at stride 2); a 1x1 convolution's c*r*s is c
    alone, a whole plane apart; NHWC: c*r*s first (c contiguous)."""
    from roller.backends.c_family.plan.schedule import stage_order
    from roller.ir.fuse import prepare

    def order(**spec: object) -> list[int]:
        expr = prepare(load_ops(dict({"op": "conv2d", "N": 1, "C": 64, "H": 28, "W": 28, "F": 64, "KH": 3,
                                      "KW": 3, "dtype": "float16"}, **spec))[0])
        x = expr.tensor("X")
        assert x.view is not None
        return stage_order(x, [64, 64])

    assert order() == [0, 1] and order(stride=2) == [0, 1] and order(KH=1, KW=1) == [0, 1]
    assert order(layout="NHWC") == [1, 0]
