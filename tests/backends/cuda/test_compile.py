"""CI compile check of the CUDA backend: every op of the scaled suite and of the 119 suite (plus float16 copies
of their matmul, batch matmul and convolution ops, which take the tensor-core path), as constructed for each
NVIDIA description, compiles for the description's target, and ptxas' registers per thread and shared memory
per block are within the description's limits and agree with the model (margins in roller/backends/cuda/check.py
and docs/cuda.md).

V100 (sm_70) is compiled with the CUDA 12 NVRTC from PyPI, since CUDA 13's nvcc no longer accepts sm_70; the
others with nvcc. One compile unit per (suite, description), two compiles at a time, results cached by source
hash in the roller cache directory.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.backends.cuda import check
from roller.backends.cuda.toolchain import compiler_for
from roller.errors import ToolchainError

ROOT = Path(__file__).resolve().parents[3]


def _compiler(target: str) -> str | None:
    try:
        return compiler_for(target)
    except ToolchainError:
        return None


pytestmark = [pytest.mark.nvcc, pytest.mark.slow]


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[check.Unit, object]]:
    units = []
    for suite in check.SUITES:
        ops = check.suite_ops(ROOT / f"bench/suites/{suite}.json")
        for desc in check.NVIDIA_DESCRIPTIONS:
            hw = H.load(desc)
            if _compiler(hw.target) is not None:
                units.append(check.build_unit(f"{suite}_{desc}", ops, hw))
    results = check.compile_all(units, jobs=2)
    return {u.name: (u, r) for u, r in zip(units, results)}


@pytest.mark.parametrize("desc", check.NVIDIA_DESCRIPTIONS)
@pytest.mark.parametrize("suite", check.SUITES)
def test_suite_compiles_within_limits(compiled, suite: str, desc: str) -> None:  # type: ignore[no-untyped-def]
    target = H.load(desc).target
    if _compiler(target) is None:
        pytest.skip(f"no CUDA compiler for {target} here (nvcc, or pip install nvidia-cuda-nvrtc-cu12)")
    unit, result = compiled[f"{suite}_{desc}"]
    assert len(unit.entries) >= {"roller119": 170, "scaled": 60}.get(suite, 12)
    assert set(result.usage) >= {e.kernel for e in unit.entries}
    found = check.problems(unit, result)
    assert not found, "\n".join(found)


def test_tensor_core_path_is_compiled(compiled) -> None:  # type: ignore[no-untyped-def]
    """The float16 GEMM-shaped ops of the 119 suite mostly take the wmma path, and those kernels compile with
    ptxas' shared memory equal to the model's (staged tiles + per-warp scratch; a ring's dynamic allocation:
    stages x the staged tiles + scratch, up to its alignment)."""
    for desc in ("a100", "h100"):
        unit, result = compiled[f"roller119_{desc}"]
        wmma = [e for e in unit.entries if e.use_matrix]
        f16 = [e for e in unit.entries if e.kernel.endswith("_f16")]
        assert len(wmma) >= len(f16) // 2, [e.line for e in f16]
        for e in wmma:
            assert "mma_sync" in unit.source
            assert check.smem_agrees(unit, e, result.usage[e.kernel]), e.line


def test_sm70_uses_cuda12_nvrtc() -> None:
    """Plainly: V100 kernels are compiled for sm_70 itself, through NVRTC 12 (nvcc 13 rejects sm_70)."""
    c = _compiler("sm_70")
    if c is None:
        pytest.skip("nvidia-cuda-nvrtc-cu12 is not installed")
    assert c == "nvrtc"
