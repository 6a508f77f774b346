"""SASS of the pipelined float16 GEMM (issue 41, F1), read with cuobjdump: the ring must compile to
asynchronous copies (LDGSTS), their group barriers (LDGDEPBAR / DEPBAR) and one block barrier a step, with
nothing spilled to local memory; the same op built for bench/hw/h200-s1.yaml (one stage) must not, which shows
the assertions can fail. Skipped without nvcc or cuobjdump (pip install nvidia-cuda-cuobjdump)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import roller.hw as H
from roller.backends.cuda import BACKEND
from roller.backends.cuda.toolchain import compile_unit, nvcc_path
from roller.construction import construct
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[3]


def _cuobjdump() -> str | None:
    """cuobjdump on PATH, or the one the nvidia-cuda-cuobjdump wheel puts in this environment."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for site in map(Path, sys.path):
        tool = site / "nvidia" / "cu13" / "bin" / "cuobjdump"
        if tool.is_file():
            return str(tool)
    return None


CUOBJDUMP = _cuobjdump()
pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(nvcc_path() is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")]
MM4096 = {"op": "matmul", "M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}


def _sass(desc: str, tmp: Path) -> tuple[str, object, dict]:  # type: ignore[type-arg]
    """(SASS text, ptxas usage, launch) of the top-1 program of a 4096^3 float16 matmul on ``desc``."""
    hw = H.load(desc)
    op = load_ops(MM4096)[0]
    prog = construct(op, hw, top_k=1, matrix=BACKEND.matrix_support)[0]
    art = BACKEND.render(prog, hw)
    result = compile_unit(art.source, hw.target, tmp, art.kernel_name, keep_cubin=True, use_cache=False)
    assert CUOBJDUMP is not None and result.cubin is not None
    env = dict(os.environ, PATH=f"{Path(CUOBJDUMP).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # nvdisasm
    sass = subprocess.run([CUOBJDUMP, "-sass", str(result.cubin)], check=True, capture_output=True, text=True,
                          env=env).stdout
    return sass, result.usage[art.kernel_name], art.launch


def _count(sass: str, opcode: str) -> int:
    return len(re.findall(rf"\s{re.escape(opcode)}[\s.;]", sass))


def test_pipelined_gemm_sass(tmp_path: Path) -> None:
    sass, usage, launch = _sass("h200", tmp_path)
    stages = launch.get("stages", 1)
    assert stages >= 2, "construction must pipeline the 4096^3 float16 GEMM on h200"
    assert _count(sass, "LDGSTS.E.BYPASS.128") > 0, "cp.async.cg 16-byte copies"
    assert _count(sass, "LDGDEPBAR") > 0 and _count(sass, "DEPBAR.LE") > 0, "commit_group / wait_group"
    assert _count(sass, "BAR.SYNC") == 1, "one block barrier a step (the epilogue syncs warps only)"
    assert _count(sass, "HMMA.16816.F32") > 0
    assert _count(sass, "LDL") == 0 and _count(sass, "STL") == 0, "nothing in local memory"
    assert usage.spill_stores == 0 and usage.spill_loads == 0  # type: ignore[attr-defined]
    assert usage.smem_bytes == 0, "the ring is all dynamic shared memory"  # type: ignore[attr-defined]
    assert launch["dynamic_shared_bytes"] == launch["shared_bytes"] > 48 * 1024


def test_one_stage_control_has_no_async_copies(tmp_path: Path) -> None:
    """The A/B description capped at one stage renders the synchronous loop: the assertions above fail on it."""
    sass, _, launch = _sass(str(ROOT / "bench/hw/h200-s1.yaml"), tmp_path)
    assert "stages" not in launch
    assert _count(sass, "LDGSTS.E.BYPASS.128") == 0 and _count(sass, "DEPBAR.LE") == 0
    assert _count(sass, "BAR.SYNC") == 2
