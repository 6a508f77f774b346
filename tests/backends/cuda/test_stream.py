"""The vector form of ops with no reuse (RProgram.vector; roller/construction/stream.py, plan StreamPlan,
templates/stream.cu.j2): 16-byte structs loaded before their first use, a grid-stride loop, and a scalar loop
for the tail and for buffers off the vector's alignment.

Run on the CPU through the CUDA stand-in (cuda_emu.h) against roller.reference: extents with a partial last
chunk and a scalar tail, a grid of fewer blocks than chunks (several turns of the loop), buffers one element
off alignment, float32 and float16. nvcc compiles them for sm_90, and where cuobjdump is installed the relu of
the suite's E0 has 16-byte loads and stores and no local memory in its SASS."""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import roller
import roller.hw as H
from roller.backends import get
from roller.backends.cuda import sass
from roller.backends.cuda.toolchain import compile_unit, nvcc_path
from roller.compiler.check import check_against
from roller.construction import construct
from roller.errors import CheckError
from roller.ir import load_ops
from roller.ir.reference import random_inputs
from roller.program import RProgram

EMU = Path(__file__).resolve().parent / "cuda_emu"
CXX = shutil.which("g++")
CUDA = get("cuda")
NP = {"float32": np.float32, "float16": np.float16}
CTYPE = {"float32": "float", "float16": "__half"}

DRIVER = """#include "cuda_emu.h"
#include <cstdio>
{kernel}
int main(int argc, char** argv) {{
    const int off = std::atoi(argv[1]);   // elements every buffer is moved off its alignment
{loads}
    emu_launch({name}, {grid}, {block}, {args});
    FILE* f = std::fopen(argv[{nout}], "wb"); std::fwrite(out + off, sizeof(*out), {n}, f); std::fclose(f);
    return 0;
}}
"""


def vector_programs(spec: dict, hw: str = "h200") -> list[RProgram]:
    op = load_ops(spec)[0]
    return [p for p in construct(op, H.load(hw), top_k=40, vectors=True) if p.vector > 1]


def build(prog: RProgram, tmp: Path, edit: Callable[[str], str] = str) -> Path:
    """The emulated kernel of ``prog`` (its source through ``edit``) as an executable: ``exe OFF IN... OUT``
    (OFF: elements every buffer starts past a 16-byte boundary)."""
    art = CUDA.render(prog, H.load("h200"))
    src = re.sub(r"^#include <(cuda_fp16|cuda_bf16|mma)\.h>$", "", edit(art.source), flags=re.MULTILINE)
    specs = art.launch["arguments"]
    n = int(np.prod(specs[-1]["shape"]))
    loads = []
    args = []
    for i, s in enumerate(specs):
        var = "out" if s["role"] == "output" else f"in{i}"
        ctype = CTYPE[s["dtype"]]
        loads.append(f"    alignas(16) static {ctype} {var}[{n + 8}];")
        if s["role"] == "input":
            loads.append(f"    {{ FILE* f = std::fopen(argv[{i + 2}], \"rb\"); "
                         f"if (std::fread({var} + off, sizeof(*{var}), {n}, f) != {n}) return 2; std::fclose(f); }}")
            args.append(f"(const {ctype}*)({var} + off)")
        else:
            args.append(f"{var} + off")
    (tmp / "k.cpp").write_text(DRIVER.format(kernel=src, loads="\n".join(loads), name=art.kernel_name,
                                             grid=art.launch["grid"][0], block=art.launch["block"][0],
                                             args=", ".join(args), nout=len(specs) + 1, n=n))
    exe = tmp / "k"
    r = subprocess.run([CXX or "g++", "-std=c++20", "-O1", "-pthread", f"-I{EMU}", str(tmp / "k.cpp"), "-o",
                        str(exe)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def run(exe: Path, op, x: dict, tmp: Path, dtype: str, off: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    files = []
    for t in op.inputs:
        f = tmp / f"{t.name}.bin"
        np.ascontiguousarray(x[t.name], dtype=NP[dtype]).tofile(f)
        files.append(str(f))
    out = tmp / "out.bin"
    r = subprocess.run([str(exe), str(off), *files, str(out)], check=False, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=NP[dtype])


@pytest.mark.skipif(CXX is None, reason="g++ is not installed")
@pytest.mark.parametrize("spec", [
    # 4 x 128 x 3 vectors and 5 more, and 3 elements past the last whole vector
    {"op": "elementwise", "fn": "relu", "shapes": {"X": [3, 2059]}, "dtype": "float32"},
    {"op": "elementwise", "fn": "sigmoid", "shapes": {"X": [6211]}, "dtype": "float16"},
    {"op": "elementwise", "fn": "add", "shapes": {"A": [5, 413], "B": [5, 413]}, "dtype": "float32"},
    {"op": "elementwise", "fn": "mul", "shapes": {"A": [2, 4096], "B": [2, 4096]}, "dtype": "float16"},
])
def test_vector_kernels_match_reference(spec: dict, tmp_path: Path) -> None:
    """Every vector program of block 128 (U = 1, 2, 4), launched with its own grid and with 2 blocks (several
    turns of the grid-stride loop), on aligned buffers and on buffers one element off (the scalar loop)."""
    op = load_ops(spec)[0]
    progs = [p for p in vector_programs(spec) if p.block == 128]
    assert sorted(p.thread_tile.shape[0] // p.vector for p in progs) == [1, 2, 4]
    x = random_inputs(op, seed=5)
    ref = roller.reference(op, x)
    dtype = spec["dtype"]
    for i, p in enumerate(progs):
        for grid in sorted({p.grid, 2}):
            folder = tmp_path / f"{i}-{grid}"
            folder.mkdir()
            exe = build(dataclasses.replace(p, grid=grid), folder)
            for off in (0, 1):
                y = run(exe, op, x, folder, dtype, off)
                check_against(f"{p.line()} grid {grid} off {off}", op, x, y.reshape(ref.shape))


@pytest.mark.skipif(CXX is None, reason="g++ is not installed")
def test_a_wrong_lane_fails(tmp_path: Path) -> None:
    """Negative control: the same harness catches a kernel whose vectors store their lanes one place over."""
    spec = {"op": "elementwise", "fn": "relu", "shapes": {"X": [1100]}, "dtype": "float32"}
    op = load_ops(spec)[0]
    p = next(p for p in vector_programs(spec) if p.block == 128)
    assert "rl_y.v[rl_k] =" in CUDA.render(p, H.load("h200")).source
    x = random_inputs(op, seed=5)
    ref = roller.reference(op, x)
    exe = build(p, tmp_path, lambda src: src.replace("rl_y.v[rl_k] =", "rl_y.v[(rl_k + 1) % 4] ="))
    y = run(exe, op, x, tmp_path, "float32", 0)
    with pytest.raises(CheckError):
        check_against(p.line(), op, x, y.reshape(ref.shape))


E0 = {"op": "elementwise", "fn": "relu", "shapes": {"X": [128, 1008, 42, 42]}, "dtype": "float32"}


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_e0_compiles_to_16_byte_accesses(dtype: str, tmp_path: Path) -> None:
    """Every vector program of E0 compiles for sm_90 with no spills; where cuobjdump is installed, each has
    16-byte loads and stores (LDG.E.128*, STG.E.128) and no local memory (LDL/STL)."""
    hw = H.load("h200")
    progs = vector_programs(dict(E0, dtype=dtype))
    assert progs
    for i, p in enumerate(progs):
        art = CUDA.render(p, hw)
        res = compile_unit(art.source, hw.target, tmp_path, art.kernel_name, keep_cubin=True, use_cache=False)
        usage = res.usage[art.kernel_name]
        assert usage.spill_stores == usage.spill_loads == usage.stack_bytes == 0, p.line()
        if not sass.available() or res.cubin is None:
            continue
        ops = sass.instructions(res.cubin, art.kernel_name)
        assert sass.count(ops, "LDG.E.128") and sass.count(ops, "STG.E.128"), p.line()
        assert sass.count(ops, "LDL") == sass.count(ops, "STL") == 0, p.line()
    if not sass.available():
        pytest.skip("cuobjdump is not installed: compiled, SASS not read")
