"""The SASS of rendered kernels, read with cuobjdump: what a kernel's form promises is in the instructions
the GPU will run (gpu-mainloops study, section 2.1), so that a kernel that silently lost its 16-byte staging
or its tensor-core MMAs, or spills, fails here before any GPU time is spent."""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.cuda import sass
from roller.backends.cuda.toolchain import Usage, compile_unit, nvcc_path
from roller.construction import construct
from roller.ir import load_ops

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed"),
              pytest.mark.skipif(not sass.available(), reason="cuobjdump/nvdisasm are not installed")]
CUDA = get("cuda")
ROOT = Path(__file__).resolve().parents[3]
MM4096 = {"name": "mm", "op": "matmul", "M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}


def compiled(op: dict, hw_name: str, tmp_path: Path) -> tuple[list[str], Usage, dict]:
    """(SASS opcodes, ptxas usage, launch) of the top-1 program of ``op`` on ``hw_name``."""
    hw = H.load(hw_name)
    prog = construct(load_ops(op)[0], hw, top_k=1, matrix=CUDA.matrix_support)[0]
    art = CUDA.render(prog, hw)
    res = compile_unit(art.source, hw.target, tmp_path, art.kernel_name, keep_cubin=True, use_cache=False)
    assert res.cubin is not None
    return sass.instructions(res.cubin, art.kernel_name), res.usage[art.kernel_name], art.launch


def top1_sass(op: dict, hw_name: str, tmp_path: Path) -> list[str]:
    return compiled(op, hw_name, tmp_path)[0]


def test_float16_matmul_stages_16_byte_rows_and_runs_tensor_cores(tmp_path: Path) -> None:
    ops = top1_sass({"name": "mm", "op": "matmul", "M": 1024, "N": 1024, "K": 1024, "dtype": "float16"},
                    "h200", tmp_path)
    assert sass.count(ops, "LDG.E.128") > 0 and sass.count(ops, "STS.128") > 0
    assert sass.count(ops, "HMMA.16816.F32") > 0 and sass.count(ops, "LDSM") > 0
    assert sass.count(ops, "LDL") == sass.count(ops, "STL") == 0


def test_count_takes_modifiers_after_the_prefix_only() -> None:
    ops = ["LDG.E.128.CONSTANT", "LDG.E", "BAR.SYNC.DEFER_BLOCKING", "LDGSTS.E.BYPASS.128"]
    assert sass.count(ops, "LDG.E.128") == 1
    assert sass.count(ops, "LDG") == 2          # LDGSTS is another instruction, not a modifier of LDG
    assert sass.count(ops, "BAR.SYNC") == 1 and sass.count(ops, "LDGSTS") == 1


def test_pipelined_float16_gemm_is_async_copies_and_one_barrier_a_step(tmp_path: Path) -> None:
    """The ring (issue 41, F1) compiles to cp.async copies (LDGSTS), their group barriers (LDGDEPBAR /
    DEPBAR) and one block barrier a step, all in dynamic shared memory, nothing spilled."""
    ops, usage, launch = compiled(MM4096, "h200", tmp_path)
    assert launch.get("stages", 1) >= 2, "construction must pipeline the 4096^3 float16 GEMM on h200"
    assert sass.count(ops, "LDGSTS.E.BYPASS.128") > 0
    assert sass.count(ops, "LDGDEPBAR") > 0 and sass.count(ops, "DEPBAR.LE") > 0
    assert sass.count(ops, "BAR.SYNC") == 1, "one block barrier a step (the epilogue syncs warps only)"
    assert sass.count(ops, "HMMA.16816.F32") > 0
    assert sass.count(ops, "LDL") == sass.count(ops, "STL") == 0
    assert usage.spill_stores == usage.spill_loads == 0
    assert usage.smem_bytes == 0, "the ring is all dynamic shared memory"
    assert launch["dynamic_shared_bytes"] == launch["shared_bytes"] > 48 * 1024


def test_one_stage_control_has_no_async_copies(tmp_path: Path) -> None:
    """The A/B description capped at one stage renders the synchronous loop: the assertions above fail on it."""
    ops, _, launch = compiled(MM4096, str(ROOT / "bench/hw/h200-s1.yaml"), tmp_path)
    assert "stages" not in launch
    assert sass.count(ops, "LDGSTS") == 0 and sass.count(ops, "DEPBAR.LE") == 0
    assert sass.count(ops, "BAR.SYNC") == 2
@pytest.mark.parametrize("dtype,mma", [("float32", "FFMA"), ("float16", "HMMA.16816.F32")])
def test_split_k_pair_has_no_atomics_and_no_spills(dtype: str, mma: str, tmp_path: Path) -> None:
    """Construction's split top-1 for M1 on h200: the GEMM kernel computes (FFMA / HMMA) and stores partials
    with plain stores, the second kernel sums them with plain loads; neither uses an atomic or local memory."""
    hw = H.load("h200")
    op = load_ops({"name": "M1", "op": "matmul", "M": 128, "N": 1000, "K": 4032, "dtype": dtype})[0]
    prog = construct(op, hw, top_k=1, matrix=CUDA.matrix_support, split_k=True)[0]
    assert prog.reduce_threads > 1, prog.line()
    art = CUDA.render(prog, hw)
    res = compile_unit(art.source, hw.target, tmp_path, art.kernel_name, keep_cubin=True)
    assert res.cubin is not None
    gemm = sass.instructions(res.cubin, art.kernel_name)
    total = sass.instructions(res.cubin, art.launch["split_k"]["reduce_kernel"])
    assert sass.count(gemm, mma) > 0 and sass.count(gemm, "STG") > 0
    assert sass.count(total, "LDG") >= 1 and sass.count(total, "STG") == 1
    for ops in (gemm, total):
        assert sass.count(ops, "RED") == sass.count(ops, "ATOM") == sass.count(ops, "ATOMG") == 0
        assert sass.count(ops, "LDL") == sass.count(ops, "STL") == 0


F32_MM = {"name": "mm", "op": "matmul", "M": 4096, "N": 4096, "K": 1024, "dtype": "float32"}


def test_float32_gemm_reads_shared_memory_in_16_byte_vectors(tmp_path: Path) -> None:
    """Step 3 of issue 41: the float32 GEMM's inner loop issues one 16-byte shared read (LDS.128) per 16 FMAs
    (4-byte reads: one per 4), its tiles staged with 16-byte loads, nothing spilled; the A/B description with
    4-byte shared reads renders the kernel of before, whose reads the same check counts as 4-byte ones."""
    ops, usage, launch = compiled(F32_MM, "h200", tmp_path)
    assert "shared-vector 4" in launch["rprogram"]
    ffma, wide = sass.count(ops, "FFMA"), sass.count(ops, "LDS.128")
    assert wide > 0 and ffma >= 16 * wide and sass.count(ops, "LDS") == wide, (ffma, wide, sass.count(ops, "LDS"))
    assert sass.count(ops, "LDL") == sass.count(ops, "STL") == 0 and usage.spill_stores == 0
    old, _, old_launch = compiled(F32_MM, str(ROOT / "bench/hw/h200-lds1.yaml"), tmp_path / "lds1")
    assert "shared-vector" not in old_launch["rprogram"]
    assert sass.count(old, "LDS.128") == 0 and sass.count(old, "FFMA") <= 4 * sass.count(old, "LDS")
