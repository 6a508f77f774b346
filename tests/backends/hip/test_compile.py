"""CI compile check of the HIP backend: every op of the scaled suite and of the 119 suite, as constructed for each
AMD description (MI50, MI100, MI250X, MI300X), compiles with Debian's hipcc (ROCm 5.2) for the description's
target (MI300X's gfx942 as gfx940, which ROCm 5.2 knows), and the per-kernel resource usage hipcc reports is
within the description's limits: VGPRs (+AGPRs where the file is unified), SGPRs, no spills or scratch, the
block's waves within the unit's register file, LDS equal to the plan's staging buffers and within the block's
LDS capacity. Also the float16 copies of the suites' matmul, batch matmul and convolution ops as MFMA programs
on MI100 and newer, whose device assembly must contain v_mfma instructions.

One hipcc call per (suite, description), two at a time, cached by source hash (roller/backends/rocm_hip/hipcc.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.backends.rocm_hip import BACKEND, compile_check, hipcc, register_cap
from roller.construction import construct, matrix_candidates
from roller.errors import CompileError, ToolchainError
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[3]
SUITES = {name: load_ops(ROOT / f"bench/suites/{name}.json") for name in ("scaled", "roller119", "fused")}


def _hipcc_missing() -> str:
    try:
        hipcc.find()
        return ""
    except ToolchainError as err:
        return str(err)


pytestmark = [pytest.mark.skipif(bool(_hipcc_missing()), reason=_hipcc_missing() or "hipcc present"),
              pytest.mark.hipcc]


@pytest.fixture(scope="module")
def scalar_rows(tmp_path_factory: pytest.TempPathFactory) -> list[compile_check.KernelCheck]:
    return compile_check.check(SUITES, compile_check.AMD_DESCRIPTIONS, tmp_path_factory.mktemp("hip-suites"))


@pytest.fixture(scope="module")
def matrix_rows(tmp_path_factory: pytest.TempPathFactory) -> list[compile_check.KernelCheck]:
    suites = {f"{k}-float16": compile_check.float16_gemms(v) for k, v in SUITES.items()}
    return compile_check.check(suites, compile_check.AMD_DESCRIPTIONS, tmp_path_factory.mktemp("hip-mfma"),
                               programs=compile_check.best_mfma_program)


@pytest.mark.slow
@pytest.mark.parametrize("device", compile_check.AMD_DESCRIPTIONS)
def test_every_suite_op_compiles_within_limits(scalar_rows: list[compile_check.KernelCheck], device: str) -> None:
    hw = H.load(device)
    rows = [r for r in scalar_rows if r.hw == device]
    assert sorted(r.op for r in rows) == sorted(op.name for ops in SUITES.values() for op in ops)
    assert {r.target for r in rows} == {"gfx940" if hw.target == "gfx942" else hw.target}
    over = {r.op: r.problems for r in rows if r.problems}
    assert not over, f"{device}: kernels over the description's limits: {over}"
    lds_cap = hw.layer("shared").capacity_per_block_bytes
    dtypes = {op.name: op.inputs[0].dtype for ops in SUITES.values() for op in ops}
    for r in rows:
        assert r.usage["lds_bytes"] <= lds_cap
        assert r.registers <= register_cap(r.block, hw), (r.op, r.line)
        if dtypes[r.op] == "float32":
            assert r.mfma_count == 0 and r.matrix is None  # float32 programs stay on the vector units
        else:   # a float16 op's top-1 may be an MFMA program (the fused suite's): then it issues MFMA
            assert (r.matrix is not None) == bool(r.mfma_count), (r.op, r.line)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["mi100", "mi250x", "mi300x"])
def test_float16_gemms_use_mfma_within_limits(matrix_rows: list[compile_check.KernelCheck], device: str) -> None:
    hw = H.load(device)
    rows = [r for r in matrix_rows if r.hw == device]
    gemms = [op for ops in SUITES.values() for op in compile_check.float16_gemms(ops)]
    # every float16 GEMM whose extents the instruction tiles within the padding rule gets an MFMA kernel
    assert len(rows) >= 0.9 * len(gemms), sorted({op.name for op in gemms} - {r.op for r in rows})
    over = {r.op: r.problems for r in rows if r.problems}
    assert not over, f"{device}: {over}"
    names = {mi.name for mi in hw.matrix_instructions}
    for r in rows:
        assert r.matrix in names and r.mfma_count and r.mfma_count > 0


def test_mi50_has_no_matrix_programs() -> None:
    """gfx906 has no matrix cores: its description lists none, so no MFMA program is built for it."""
    ops = compile_check.float16_gemms(SUITES["scaled"])
    assert ops and all(compile_check.best_mfma_program(op, H.load("mi50")) is None for op in ops)


def test_limits_report_flags_each_limit() -> None:
    """Negative controls for the resource assertions: each broken limit is reported."""
    hw = H.load("mi50")
    ok = {"vgprs": 40, "agprs": 0, "sgprs": 20, "vgpr_spills": 0, "sgpr_spills": 0, "scratch_bytes": 0,
          "lds_bytes": 4096, "occupancy": 8}
    assert hipcc.limits_report(ok, hw, 256, 4096, 2) == []
    cases = {"vgprs": 300, "sgprs": 200, "vgpr_spills": 3, "scratch_bytes": 16, "lds_bytes": 70000}
    for key, value in cases.items():
        assert hipcc.limits_report({**ok, key: value}, hw, 256, 4096, 2), key
    assert hipcc.limits_report({**ok, "vgprs": 100}, hw, 1024, 4096, 2)  # 4 waves/SIMD x 100 > 256
    assert hipcc.limits_report(ok, hw, 256, 2048, 2)  # LDS is not what the plan stages


def test_wavefront_width_is_asserted_at_compile_time(tmp_path: Path) -> None:
    """The kernel states the description's wavefront width; a description claiming 32-wide wavefronts for
    gfx906 (a wave64-only GCN part) does not compile."""
    op = SUITES["scaled"][0]
    wrong = H.load("mi50", {"parallelism.warp_size": "32"})
    art = BACKEND.render(construct(op, wrong, top_k=1)[0], wrong)
    assert "__AMDGCN_WAVEFRONT_SIZE == 32" in art.source
    with pytest.raises(CompileError, match="static assertion failed"):
        hipcc.check_artifacts([art], wrong, tmp_path, label="wave32")
    right = H.load("mi50")
    usage = hipcc.check_artifacts([BACKEND.render(construct(op, right, top_k=1)[0], right)], right, tmp_path)
    assert usage[op.name]["vgprs"] > 0


def test_lds_padding_follows_the_description_banks() -> None:
    """Rule 2.2c: the staged rows of a matmul get storage padding from the LDS bank count and width, and
    a description with one wide bank gets none."""
    op = load_ops({"op": "matmul", "M": 256, "N": 256, "K": 256})[0]
    hw = H.load("mi100")
    plan = BACKEND.render(construct(op, hw, top_k=1)[0], hw).extra["plan"]
    assert any(t.row_pad for t in plan.inputs)
    flat = H.load("mi100", {"memory[1].banks": "1", "memory[1].bank_width_bytes": "4"})
    plan = BACKEND.render(construct(op, flat, top_k=1)[0], flat).extra["plan"]
    assert not any(t.row_pad for t in plan.inputs)


def test_mfma_programs_are_aligned_to_the_instruction() -> None:
    op = load_ops({"op": "matmul", "M": 200, "N": 300, "K": 100, "dtype": "float16"})[0]
    for device in ("mi100", "mi250x", "mi300x"):
        hw = H.load(device)
        progs = matrix_candidates(op, hw, BACKEND.matrix_support, want=20)
        assert progs
        for p in progs:
            art = BACKEND.render(p, hw)
            m = art.extra["mfma"]
            assert m.wave_m % m.im == 0 and m.wave_n % m.in_ == 0 and m.block_k % m.ik == 0
            assert p.block == m.wave * (p.block_tile.shape[0] // m.wave_m) * (p.block_tile.shape[1] // m.wave_n)
            assert m.builtin in art.source and art.launch["matrix_instruction"] == m.instruction.name


def test_a_runner_code_object_is_compiled_once_and_kept(tmp_path: Path, private_cache: Path) -> None:
    """What the HIP runner loads (``hipcc --genco``) comes from Roller's cache the second time, even into
    another folder: a warm build on an AMD GPU runs no hipcc. A damaged stored object is compiled again."""
    op = SUITES["scaled"][0]
    hw = H.load("mi100")
    art = BACKEND.render(construct(op, hw, top_k=1)[0], hw)
    before = hipcc.CODE_OBJECT_BUILDS["count"]
    first = hipcc.code_object(art, hw, "gfx908", tmp_path / "a")
    code = (b"\x7fELF", b"__CLANG_OFFLOAD_BUNDLE__")   # an ELF code object, or clang's bundle of one
    assert first.startswith(code) and hipcc.CODE_OBJECT_BUILDS["count"] == before + 1
    assert hipcc.code_object(art, hw, "gfx908", tmp_path / "b") == first
    assert hipcc.CODE_OBJECT_BUILDS["count"] == before + 1 and not (tmp_path / "b").exists()
    (blob,) = (private_cache / "results" / "hip-code-object").rglob("*.bin")
    blob.write_bytes(blob.read_bytes()[:-8])
    assert hipcc.code_object(art, hw, "gfx908", tmp_path / "c") == first
    assert hipcc.CODE_OBJECT_BUILDS["count"] == before + 2
