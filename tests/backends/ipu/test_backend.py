"""The poplar backend's contract: registry, what it renders for, and what it says where the Poplar SDK is
absent (it is not installable here: neither PyPI nor Debian has it)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from roller.backends import for_hw, get
from roller.cli.main import main
from roller.construction import construct
from roller.errors import InputError, ToolchainError
from roller.hw import load
from roller.ir import load_op

ROOT = Path(__file__).resolve().parents[3]
BACKEND = get("poplar")
MATMUL = {"name": "mm", "op": "matmul", "M": 33, "N": 17, "K": 9}
no_sdk = pytest.mark.skipif(shutil.which("popc") is not None, reason="the Poplar SDK is installed here")


def test_registry_serves_the_ipu_descriptions() -> None:
    for name in ("ipu-gc2", "ipu-gc200"):
        assert for_hw(load(name)) is BACKEND
    assert BACKEND.name == "poplar" and BACKEND.file_ext == "cpp"


def test_render_files_and_launch() -> None:
    hw = load("ipu-gc200")
    prog = construct(load_op(MATMUL), hw, top_k=1)[0]
    art = BACKEND.render(prog, hw)
    assert list(art.files) == ["codelets.cpp", "host.cpp", "graph_plan.hpp", "graph_plan.json", "Makefile"]
    assert art.main_file == "codelets.cpp" and art.kernel_name == "rl_mm_vertex"
    assert art.launch["vertices"] == prog.grid and art.launch["workers_per_vertex"] == prog.block
    assert art.launch["compute_sets"] == -(-prog.grid // 1472) and art.launch["target"] == "ipu2"


def test_render_refuses_other_descriptions() -> None:
    """A GPU rProgram stages its reduction and its device memory is not the tiles' SRAM: no IPU plan."""
    hw = load("v100")
    prog = construct(load_op(MATMUL), hw, top_k=1)[0]
    with pytest.raises(InputError, match="tiles' memories"):
        BACKEND.render(prog, hw)


def test_render_refuses_float16() -> None:
    hw = load("ipu-gc2")
    prog = construct(load_op(dict(MATMUL, dtype="float16")), hw, top_k=1)[0]
    with pytest.raises(InputError, match="float32"):
        BACKEND.render(prog, hw)


@no_sdk
def test_without_the_sdk_nothing_runs_and_the_reason_says_how(tmp_path: Path) -> None:
    assert not BACKEND.can_run_here()
    assert "Poplar SDK" in BACKEND.why_not_here() and "popc" in BACKEND.why_not_here()
    hw = load("ipu-gc2")
    art = BACKEND.render(construct(load_op(MATMUL), hw, top_k=1)[0], hw)
    with pytest.raises(ToolchainError, match="not on PyPI or Debian") as err:
        BACKEND.compile(art, hw, tmp_path)
    assert err.value.exit_code == 5
    with pytest.raises(ToolchainError):
        BACKEND.check_compiles(art, hw, tmp_path)


@no_sdk
def test_build_eval_says_the_sdk_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    op = tmp_path / "op.json"
    op.write_text('{"name": "mm", "op": "matmul", "M": 8, "N": 8, "K": 8}')
    rc = main(["build", "--hw", str(ROOT / "hwdesc" / "ipu-gc2.yaml"), str(op), "--eval", "-o",
               str(tmp_path / "out")])
    assert rc == 5
    assert "Poplar SDK" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
