"""Transposes on a CPU: reads gathered along the vector axis load whole vectors along the input's rows
(plan.vector._transposed_read), and tiles of equal predicted time are ordered by the contiguous runs they move
(TileGeometry.row_runs), so blocks come out square. The kernels run on PoCL against numpy."""
from __future__ import annotations

import pytest

import roller.hw as H
from roller.backends import get
from roller.compiler.check import check_against
from roller.construction import construct
from roller.ir import load_op
from roller.ir.reference import random_inputs
from roller.perf.traffic import TileGeometry

CPU = H.load("pocl-cpu")
OPENCL = get("opencl")


def test_a_large_transpose_gets_square_blocks_and_vector_loads() -> None:
    op = load_op({"name": "t", "op": "transpose", "shape": [4096, 4096], "perm": [1, 0]})
    cached = H.load("pocl-cpu", overrides={"memory[0].streaming_stores": "false"})
    p = construct(op, cached, top_k=4)[0]
    assert p.block_tile.shape == (256, 256) and p.thread_tile.shape == (16, 16)
    geo = TileGeometry(p.expr)
    assert geo.row_runs((256, 256)) < geo.row_runs((4096, 16))
    # Stored past the caches (streaming stores, tests/backends/opencl/test_streaming_stores.py), the output's runs do not
    # count: the blocks that read the longest runs of the input's rows (i1) come first.
    streamed = construct(op, CPU, top_k=4)[0]
    assert streamed.block_tile.shape[0] > streamed.block_tile.shape[1]
    assert geo.row_runs(streamed.block_tile.shape, output=False) < geo.row_runs((256, 256), output=False)
    src = OPENCL.render(p, cached).files["kernel.cl"].replace("(long)", "")   # the CPU's 64-bit indices
    assert "vload16(0, X + ((rl_g_i0 + 15)) * 4096 + ((rl_g_i1 - ((rl_j / 16) % 16))))[((rl_j / 16) % 16)]" in src


@pytest.mark.parametrize("shape,perm", [
    ([64, 48], [1, 0]),
    ([37, 50], [1, 0]),          # partial tiles: the lanes gather, as before
    ([6, 32, 16], [0, 2, 1]),
    ([16, 8, 32], [2, 1, 0]),
    ([32, 16, 4], [1, 0, 2]),
])
def test_transposes_match_numpy(shape: list[int], perm: list[int]) -> None:
    op = load_op({"name": "t", "op": "transpose", "shape": shape, "perm": perm})
    x = random_inputs(op, seed=11)
    for p in construct(op, CPU, top_k=5):
        y = OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs])
        check_against(p.line(), op, x, y)


def test_some_transposed_reads_are_exercised() -> None:
    seen = 0
    for shape, perm in (([64, 48], [1, 0]), ([6, 32, 16], [0, 2, 1])):
        op = load_op({"name": "t", "op": "transpose", "shape": shape, "perm": perm})
        seen += sum(")[((rl_j / " in OPENCL.render(p, CPU).files["kernel.cl"] for p in construct(op, CPU, top_k=5))
    assert seen >= 2
