"""Split-K CUDA kernels (roller/construction/splitk.py): the GEMM kernel writes float32 partials into a
workspace [S, outputs], a second kernel sums them in split order. Run on the CPU through the CUDA stand-in
(cuda_emu.h, unchanged: a driver of its own launches both kernels) against roller.reference, compiled by nvcc
where it is installed, and rendered only where construction was asked for split programs."""
from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import roller
import roller.hw as H
from roller.backends import get
from roller.compiler.check import check_against
from roller.construction import construct
from roller.construction.splitk import per_split, reduction_tiles, split_program
from roller.ir import load_ops
from roller.ir.reference import random_inputs
from tests.backends.cuda.emulator import CXX, compile_driver, kernel_source, loads_and_args, run_on

CUDA = get("cuda")

DRIVER = """#include "cuda_emu.h"
#include <cstdio>
{kernel}
int main(int argc, char** argv) {{
{loads}
    static float ws[{ws}];
    for (int i = 0; i < {ws}; ++i) ws[i] = __int_as_float(0x7fc00000);  // NaN: a partial nothing wrote shows
    emu_launch({name}, {grid}, {block}, {args}, ws);
    emu_launch({reduce}, {rgrid}, {rblock}, (const float*)ws, out);
    FILE* f = std::fopen(argv[{nout}], "wb"); std::fwrite(out, sizeof(*out), {out_elems}, f); std::fclose(f);
    return 0;
}}
"""


def run_split(art, op, x: dict, tmp: Path) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The output of ``art``'s two kernels, emulated, for inputs ``x``."""
    specs = art.launch["arguments"]
    sk = art.launch["split_k"]
    loads, args = loads_and_args(specs)
    out_spec = specs[-1]
    exe = compile_driver(DRIVER.format(
        kernel=kernel_source(art), loads=loads, ws=int(np.prod(sk["workspace_shape"])), name=art.kernel_name,
        grid=art.launch["grid"][0], block=art.launch["block"][0], args=args,
        reduce=sk["reduce_kernel"], rgrid=sk["reduce_grid"][0], rblock=sk["reduce_block"][0], nout=len(specs),
        out_elems=int(np.prod(out_spec["shape"]))), tmp)
    return run_on(exe, op, x, tmp, np.float16 if out_spec["dtype"] == "float16" else np.float32)


def small_program(op, matrix: bool, step: int = 16):  # type: ignore[no-untyped-def]
    """An unsplit program of ``op`` on h100 small enough to emulate (the matrix path's or the scalar one's),
    its k-step set to ``step`` so that the reduction has many steps to split."""
    hw = H.load("h100")
    progs = [p for p in construct(op, hw, top_k=20, matrix=CUDA.matrix_support)
             if p.use_matrix == matrix and p.grid * p.block <= 1024]
    assert progs, "no small program to split"
    p = progs[0]
    k = next(i for i, a in enumerate(op.axes) if a.reduce)
    tiles = tuple(dataclasses.replace(t, shape=t.shape[:k] + (step,) + t.shape[k + 1:]) if i <= p.block_level
                  else t for i, t in enumerate(p.tiles))
    return dataclasses.replace(p, tiles=tiles), hw


@pytest.mark.skipif(CXX is None, reason="g++ is not installed")
@pytest.mark.parametrize("spec,matrix", [
    ({"op": "matmul", "M": 37, "N": 45, "K": 299, "dtype": "float32"}, False),
    ({"op": "matmul", "M": 24, "N": 40, "K": 301, "transpose_b": True, "dtype": "float32"}, False),
    ({"op": "batch_matmul", "B": 2, "M": 20, "N": 33, "K": 250, "dtype": "float32"}, False),
    ({"op": "matmul", "M": 40, "N": 24, "K": 333, "dtype": "float16"}, True),
    ({"op": "matmul", "M": 33, "N": 20, "K": 270, "dtype": "float16"}, False),
])
def test_split_kernels_match_reference(spec: dict, matrix: bool, tmp_path: Path) -> None:
    """S = 2..8 over a K that no S x k-step divides: every split's range, the last one short, summed."""
    op = load_ops(spec)[0]
    base, hw = small_program(op, matrix)
    x = random_inputs(op, seed=5)
    ref = roller.reference(op, x)
    seen = set()
    for s in range(2, 9):
        p = split_program(base, s, hw)
        assert p is not None
        if (s - 1) * per_split(p) >= reduction_tiles(p):
            continue   # an empty last split: construction offers no such factor
        step = next(b for a, b in zip(op.axes, p.block_tile.shape) if a.reduce)
        assert op.reduce_axes[0].extent % (s * step), "K must not be a multiple of S x step"
        art = CUDA.render(p, hw)
        assert art.launch["split_k"]["factor"] == s and art.launch["grid"][0] == base.grid * s
        folder = tmp_path / str(s)
        folder.mkdir()
        y = run_split(art, op, x, folder)
        check_against(p.line(), op, x, y.reshape(ref.shape))
        seen.add(s)
    assert len(seen) >= 4, seen


@pytest.mark.skipif(CXX is None, reason="g++ is not installed")
def test_emulation_catches_a_wrong_split_range(tmp_path: Path) -> None:
    """Negative control: with each split's range one k-step short, the sum misses part of K."""
    op = load_ops({"op": "matmul", "M": 37, "N": 45, "K": 299, "dtype": "float32"})[0]
    base, hw = small_program(op, False)
    p = split_program(base, 3, hw)
    assert p is not None
    art = CUDA.render(p, hw)
    per = per_split(p)
    bad = f"const int rl_rt1 = min(rl_rt0 + {per - 1}, "
    art.files[art.main_file] = art.source.replace(f"const int rl_rt1 = min(rl_rt0 + {per}, ", bad)
    assert bad in art.source
    x = random_inputs(op, seed=5)
    y = run_split(art, op, x, tmp_path).reshape(37, 45)
    assert not np.allclose(y, roller.reference(op, x), rtol=1e-3, atol=1e-3)


def test_split_source_shape() -> None:
    """The split kernel takes the workspace last, the second kernel (workspace, output); launch.json says both
    launch shapes and the workspace's size."""
    op = load_ops({"op": "matmul", "M": 37, "N": 45, "K": 299, "dtype": "float16"})[0]
    base, hw = small_program(op, False)
    p = split_program(base, 4, hw)
    assert p is not None
    art = CUDA.render(p, hw)
    src = art.source
    sk = art.launch["split_k"]
    assert src.count("__global__") == 2 and "atomicAdd" not in src
    assert re.search(r"__half\* __restrict__ C,\s*float\* __restrict__ rl_ws\)", src)
    assert f"void {sk['reduce_kernel']}(" in src
    assert sk["workspace_bytes"] == 4 * 37 * 45 * 4 and sk["workspace_shape"] == [4, 37 * 45]
    assert sk["reduce_grid"][0] * sk["reduce_block"][0] >= 37 * 45
    # the unsplit program's kernel is what it was: no workspace, one kernel
    plain = CUDA.render(base, hw)
    assert "split_k" not in plain.launch and plain.source.count("__global__") == 1 and "rl_ws" not in plain.source


def test_unsplittable_program_is_refused() -> None:
    op = load_ops({"op": "matmul", "M": 37, "N": 45, "K": 299, "dtype": "float32"})[0]
    base, hw = small_program(op, False)
    with pytest.raises(ValueError, match="not a split-K program"):
        CUDA.render(dataclasses.replace(base, reduce_threads=reduction_tiles(base) + 1,
                                                       grid=base.grid * (reduction_tiles(base) + 1)), hw)


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_kernels_compile(dtype: str, tmp_path: Path) -> None:
    """nvcc compiles both kernels of construction's split top-1 for an M6-like GEMM on h200 (sm_90)."""
    from roller.backends.cuda.toolchain import compile_unit

    hw = H.load("h200")
    op = load_ops({"op": "matmul", "M": 2048, "N": 1024, "K": 30522, "dtype": dtype})[0]
    progs = [p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support, split_k=True)
             if p.reduce_threads > 1]
    assert progs
    art = CUDA.render(progs[0], hw)
    res = compile_unit(art.source, hw.target, tmp_path, art.kernel_name)
    assert art.kernel_name in res.usage


@pytest.mark.skipif(CXX is None, reason="g++ is not installed")
@pytest.mark.parametrize("spec", [
    {"name": "rows", "op": "reduce", "kind": "sum", "shape": [512, 1000], "axes": [1], "dtype": "float32"},
    {"name": "rows16", "op": "reduce", "kind": "sum", "shape": [64, 3000], "axes": [1], "dtype": "float16"},
])
def test_split_row_sums_match_reference(spec: dict, tmp_path: Path) -> None:
    """A sum over rows is split too where its blocks do not fill the device (the sanitizer suite's
    z_reduce_rows): the smallest split program construction offers on h200, emulated."""
    op = load_ops(spec)[0]
    hw = H.load("h200")
    progs = [p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support, split_k=True)
             if p.reduce_threads > 1]
    assert progs, "construction offers no split program"
    p = min(progs, key=lambda p: p.grid * p.block)
    x = random_inputs(op, seed=1)
    y = run_split(CUDA.render(p, hw), op, x, tmp_path)
    check_against(p.line(), op, x, y.reshape(op.output.shape))
