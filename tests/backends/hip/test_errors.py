"""HIP backend errors: a missing hipcc is a one-line ToolchainError (exit 5) naming the install command; a
kernel hipcc rejects is a CompileError (exit 3) with the log, the kernel's file and a repro command that
reproduces it; no ROCm device is reported without touching the runtime."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.rocm_hip import hipcc
from roller.construction import construct
from roller.errors import CompileError, ToolchainError
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[3]
BACKEND = get("hip")
OP = load_ops({"op": "matmul", "M": 40, "N": 24, "K": 16, "name": "mm"})[0]


def _hipcc_missing() -> str:
    try:
        hipcc.find()
        return ""
    except ToolchainError as err:
        return str(err)


needs_hipcc = pytest.mark.skipif(bool(_hipcc_missing()), reason=_hipcc_missing() or "hipcc present")


def artifact(hw_name: str = "mi50"):  # type: ignore[no-untyped-def]
    hw = H.load(hw_name)
    return BACKEND.render(construct(OP, hw, top_k=1)[0], hw), hw


def test_missing_hipcc_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLER_HIPCC", str(tmp_path / "no-hipcc"))
    art, hw = artifact()
    with pytest.raises(ToolchainError) as info:
        BACKEND.check_compiles(art, hw, tmp_path)
    text = str(info.value)
    assert "\n" not in text and "apt-get install hipcc" in text and info.value.exit_code == 5
    monkeypatch.delenv("ROLLER_HIPCC")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH either
    with pytest.raises(ToolchainError, match="apt-get install hipcc"):
        hipcc.find()
    assert hipcc.version() == "none"  # building (render only) needs no hipcc


def test_missing_hipcc_through_python_exits_5(tmp_path: Path) -> None:
    """The error reaches a user of the API as the exit code and one line, as the CLI prints it."""
    script = tmp_path / "check.py"
    script.write_text(
        "import pathlib, sys\n"
        "import roller.hw as H\n"
        "from roller.backends import get\n"
        "from roller.construction import construct\n"
        "from roller.errors import RollerError\n"
        "from roller.ir import load_ops\n"
        "op = load_ops({'op': 'matmul', 'M': 8, 'N': 8, 'K': 8})[0]\n"
        "hw, b = H.load('mi50'), get('hip')\n"
        "try:\n"
        "    b.check_compiles(b.render(construct(op, hw, top_k=1)[0], hw), hw, pathlib.Path(sys.argv[1]))\n"
        "except RollerError as e:\n"
        "    print(e, file=sys.stderr)\n"
        "    sys.exit(e.exit_code)\n")
    env = {**os.environ, "ROLLER_HIPCC": str(tmp_path / "absent")}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 5
    assert proc.stderr.strip().count("\n") == 0 and "apt-get install hipcc" in proc.stderr


@pytest.mark.hipcc
@needs_hipcc
def test_compile_error_has_log_kernel_path_and_working_repro(tmp_path: Path) -> None:
    art, hw = artifact()
    broken = dataclasses.replace(art, files={art.main_file: art.source.replace("__syncthreads();",
                                                                                 "__syncthreads(;", 1)})
    with pytest.raises(CompileError) as info:
        hipcc.check_artifacts([broken], hw, tmp_path, label="broken")
    text = str(info.value)
    assert info.value.exit_code == 3
    assert "error:" in text and "expected expression" in text
    kernel = next(line.split("kernel: ", 1)[1] for line in text.splitlines() if line.startswith("kernel: "))
    assert Path(kernel).read_text() == broken.source
    repro = next(line.split("repro: ", 1)[1] for line in text.splitlines() if line.startswith("repro: "))
    proc = subprocess.run(repro, shell=True, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "expected expression" in proc.stderr


@pytest.mark.hipcc
@needs_hipcc
def test_backend_error_names_the_kernel_in_a_shared_unit(tmp_path: Path) -> None:
    """A kernel whose LDS exceeds the 64 KiB hipcc allows fails the unit; the error names that kernel's file,
    not its neighbours'."""
    good, hw = artifact()
    op = load_ops({"op": "matmul", "M": 40, "N": 24, "K": 16, "name": "too_big"})[0]
    big = BACKEND.render(construct(op, hw, top_k=1)[0], hw)
    plan = big.extra["plan"]
    src = big.source.replace(f"rl_sm_A[{plan.inputs[0].smem_elems}]", "rl_sm_A[20000]", 1)
    big = dataclasses.replace(big, files={big.main_file: src})
    with pytest.raises(CompileError) as info:
        hipcc.check_artifacts([good, big], hw, tmp_path, label="lds")
    kernels = next(line for line in str(info.value).splitlines() if line.startswith("kernel: "))
    assert "too_big.hip" in kernels and "mm.hip" not in kernels
    assert "local memory" in str(info.value)


def test_no_device_here_without_a_crash() -> None:
    if Path("/dev/kfd").exists():
        pytest.skip("a ROCm driver is present")
    assert BACKEND.can_run_here() is False
    assert "/dev/kfd" in BACKEND.why_not_here()
    art, hw = artifact()
    with pytest.raises(ToolchainError):
        BACKEND.compile(art, hw)


def test_backend_registry_and_files() -> None:
    hw = H.load(ROOT / "hwdesc/mi50.yaml")
    from roller.backends import for_hw

    assert for_hw(hw) is BACKEND and BACKEND.name == "hip" and BACKEND.file_ext == "hip"
    art = BACKEND.render(construct(OP, hw, top_k=1)[0], hw)
    assert list(art.files) == ["kernel.hip"] and art.launch["wavefront_size"] == 64
