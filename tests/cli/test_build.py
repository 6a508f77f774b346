"""``roller build`` (dry run, written files, atomicity, --eval) and ``roller run`` (check, inputs, save)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.cli import build_cmd
from roller.cli.main import main
from roller.construction import construct
from roller.hw import load as load_hw
from roller.ir import load_op, load_ops

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache"))


# ---- dry run --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hw,example", [("v100", "matmul.json"), ("mi50", "conv3x3.json"),
                                        ("pocl-cpu", "multi.json")])
def test_dry_run_json_is_construct(capsys, hw, example):
    rc, out, err = _run(capsys, "build", "--hw", hw, str(EXAMPLES / example), "--dry-run", "--format", "json",
                        "--top-k", "4")
    assert rc == 0, err
    docs = json.loads(out)
    want = [p.to_json() for op in load_ops(EXAMPLES / example) for p in construct(op, load_hw(hw), top_k=4)]
    assert docs == want


def test_dry_run_table(capsys):
    rc, out, _ = _run(capsys, "build", "--hw", "v100", str(EXAMPLES / "matmul.json"), "--dry-run", "--top-k", "5")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("matmul_256 on v100 (cuda): top 5 of 5 in ")
    assert lines[1].split() == ["RANK", "TILES", "GRID", "BLOCK", "PRED", "ms", "BOTTLENECK", "PEAK", "%", "PAD",
                                "%"]
    progs = construct(load_op(EXAMPLES / "matmul.json"), load_hw("v100"), top_k=5)
    for i, (line, p) in enumerate(zip(lines[2:], progs)):
        assert line.split()[0] == str(i + 1)
        assert f" {p.grid} " in line and f" {p.block} " in line and p.prediction.bottleneck in line
    assert len(lines) == 2 + len(progs)


def test_dry_run_and_eval_conflict(capsys, tmp_path):
    rc, _, err = _run(capsys, "build", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--dry-run", "--eval",
                      "-o", str(tmp_path / "o"))
    assert rc == 2 and "--dry-run" in err and not (tmp_path / "o").exists()


# ---- written files --------------------------------------------------------------------------------------------

def test_build_writes_kernel_launch_program_report(capsys, tmp_path):
    out = tmp_path / "o"
    rc, stdout, err = _run(capsys, "build", "--hw", "mi50", "--backend", "opencl", str(EXAMPLES / "multi.json"),
                           "-o", str(out), "--top-k", "3")
    assert rc == 0, err
    ops = load_ops(EXAMPLES / "multi.json")
    assert sorted(p.name for p in out.iterdir()) == sorted(op.name for op in ops)
    for op in ops:
        folder = out / op.name
        assert sorted(f.name for f in folder.iterdir()) == ["kernel.cl", "launch.json", "report.json",
                                                           "rprogram.json"]
        best = construct(op, load_hw("mi50"), top_k=3)[0]
        assert json.loads((folder / "rprogram.json").read_text()) == best.to_json()
        launch = json.loads((folder / "launch.json").read_text())
        assert launch["grid"] and launch["block"]
        assert [a["name"] for a in launch["arguments"]] == [t.name for t in op.inputs] + [op.output.name]
        report = json.loads((folder / "report.json").read_text())
        assert report["op"] == op.name and report["chosen_by"] == "model" and report["line"] == best.line()
        assert len(report["candidates"]) == 3
        src = (folder / "kernel.cl").read_text()
        assert "__kernel" in src and op.name in src
        assert f"{op.name}: wrote {out / op.name}/" in stdout


def test_build_failure_leaves_nothing(capsys, tmp_path, monkeypatch):
    """An error after some files were written (here a hook that raises) leaves neither DIR nor temp folders."""
    def boom(folder: Path) -> None:
        assert (folder / "report.json").exists()
        raise roller.errors.InputError("stop here")

    monkeypatch.setattr(build_cmd, "_after_write", boom)
    rc, _, err = _run(capsys, "build", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "-o",
                      str(tmp_path / "o"))
    assert rc == 2 and "stop here" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "cache"] or list(tmp_path.iterdir()) == []


def test_build_rebuild_replaces_only_its_op(capsys, tmp_path):
    out = tmp_path / "o"
    (out / "other").mkdir(parents=True)
    for _ in range(2):
        rc, _, err = _run(capsys, "build", "--hw", "pocl-cpu", str(EXAMPLES / "relu.json"), "-o", str(out))
        assert rc == 0, err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["other", "relu_small"]
    assert [p for p in out.parent.iterdir() if p.name.startswith(".o.tmp")] == []


def test_build_unknown_op_name(capsys, tmp_path):
    rc, _, err = _run(capsys, "build", "--hw", "pocl-cpu", str(EXAMPLES / "multi.json"), "--op", "mm_12",
                      "-o", str(tmp_path / "o"))
    assert rc == 2
    assert err.strip().startswith("roller: error: ") and "--op" in err and "did you mean 'mm_128'" in err
    assert not (tmp_path / "o").exists()


def test_build_bad_top_k(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["build", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--top-k", "0"])
    assert exc.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err


@needs_cl
def test_build_eval_keeps_fastest(capsys, tmp_path):
    out = tmp_path / "o"
    rc, stdout, err = _run(capsys, "build", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--eval",
                           "--top-k", "3", "--repeat", "3", "-o", str(out))
    assert rc == 0, err
    folder = out / "matmul_256"
    ev = json.loads((folder / "eval.json").read_text())
    measured = [c["measured_ms"] for c in ev["candidates"]]
    assert len(measured) == 3 and all(m > 0 for m in measured)
    assert ev["chosen"] == min(range(3), key=lambda i: measured[i])
    assert ev["check"]["ok"] is True
    report = json.loads((folder / "report.json").read_text())
    assert report["chosen_by"] == "measurement" and report["chosen"] == ev["chosen"]
    assert json.loads((folder / "rprogram.json").read_text())["tiles"] == \
        construct(load_op(EXAMPLES / "matmul.json"), load_hw("pocl-cpu"), top_k=3)[ev["chosen"]].to_json()["tiles"]
    assert "measured" in stdout


# ---- run ------------------------------------------------------------------------------------------------------

@needs_cl
def test_run_check_and_save(capsys, tmp_path):
    save = tmp_path / "out.npz"
    rc, out, err = _run(capsys, "run", "--hw", "pocl-cpu", str(EXAMPLES / "multi.json"), "--check", "--save",
                        str(save), "--repeat", "2")
    assert rc == 0, err
    ops = load_ops(EXAMPLES / "multi.json")
    lines = out.splitlines()
    assert len(lines) == len(ops)
    for line, op in zip(lines, ops):
        assert line.startswith(f"{op.name}  pocl-cpu/opencl  ") and "check ok" in line
        unit = " GFLOP/s" if any(a.reduce for a in op.axes) else " GB/s"
        assert unit in line
    saved = np.load(save)
    x = roller.random_inputs(ops[0], seed=0)
    np.testing.assert_allclose(saved[f"{ops[0].name}.{ops[0].output.name}"], roller.reference(ops[0], x),
                               rtol=1e-4, atol=1e-4)


@needs_cl
def test_run_given_inputs(capsys, tmp_path):
    op = load_op(EXAMPLES / "matmul.json")
    a = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    b = np.eye(256, dtype=np.float32)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    rc, _, err = _run(capsys, "run", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--inputs",
                      str(tmp_path / "in.npz"), "--save", str(tmp_path / "out.npz"), "--repeat", "1")
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")[op.output.name], a, rtol=1e-6)


def test_run_inputs_missing_tensor(capsys, tmp_path):
    np.savez(tmp_path / "in.npz", A=np.zeros((256, 256), np.float32))
    rc, _, err = _run(capsys, "run", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--inputs",
                      str(tmp_path / "in.npz"))
    assert rc == 2
    assert str(tmp_path / "in.npz") in err and "--inputs" in err and "no array for input 'B'" in err


def test_run_inputs_not_npz(capsys, tmp_path):
    (tmp_path / "in.npz").write_text("not a zip")
    rc, _, err = _run(capsys, "run", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "--inputs",
                      str(tmp_path / "in.npz"))
    assert rc == 2 and "not a readable .npz file" in err and len(err.strip().splitlines()) == 1


@needs_cl
def test_run_check_failure_exits_4(capsys, monkeypatch):
    """A wrong answer must fail the check: the reference is perturbed, the kernel is not."""
    import dataclasses

    import roller.ir.reference as ref_mod

    real = ref_mod.bound  # what run --check compares with: the reference and its error bound
    monkeypatch.setattr(ref_mod, "bound", lambda op, x: dataclasses.replace(real(op, x), ref=real(op, x).ref + 1.0))
    rc, _, err = _run(capsys, "run", "--hw", "pocl-cpu", str(EXAMPLES / "relu.json"), "--check", "--no-cache")
    assert rc == 4 and "relu_small" in err


def test_run_backend_cannot_run_here(capsys):
    rc, _, err = _run(capsys, "run", "--hw", "pocl-cpu", "--backend", "nosuch", str(EXAMPLES / "relu.json"))
    assert rc == 2 and "nosuch" in err
