"""``roller op show`` and ``roller op check``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roller.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _write(tmp_path: Path, doc, name: str = "op.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


CONV = {"name": "conv_s2", "op": "conv2d", "N": 1, "C": 32, "H": 28, "W": 28, "F": 64, "KH": 3, "KW": 3,
        "stride": 2, "padding": "SAME"}
MULTI = {"ops": [{"name": "mm", "op": "matmul", "M": 128, "N": 128, "K": 64},
                 CONV,
                 {"name": "relu4", "op": "elementwise", "fn": "relu", "shapes": {"X": [2, 3, 4, 5]}},
                 {"name": "pool", "expr": "Y[n,c,h,w] max= X[n,c,2*h+r,2*w+s]",
                  "shapes": {"X": [1, 2, 8, 8], "Y": [1, 2, 3, 3]}, "extents": {"r": 3, "s": 3},
                  "pad_value": "-inf", "dtype": "float16"}]}


# ---- op show, text --------------------------------------------------------------------------------------------

def test_show_conv_text(tmp_path, capsys):
    path = _write(tmp_path, CONV)
    rc, out, err = _run(capsys, "op", "show", str(path))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "op conv_s2 (conv2d)"
    assert lines[1] == "  Y[n,f,h,w] += X[n,c,2*h+r,2*w+s] * W[f,c,r,s]"
    assert lines[2] == "  axes:      spatial n=1 f=64 h=14 w=14 | reduction c=32 r=3 s=3"
    assert "    X  input   [1,32,28,28]  float32" in lines
    assert "    W  input   [64,32,3,3]  float32" in lines
    assert "    Y  output  [1,64,14,14]  float32" in lines
    flops = 2 * 64 * 14 * 14 * 32 * 9
    nbytes = (32 * 28 * 28 + 64 * 32 * 9 + 64 * 14 * 14) * 4
    assert f"  flops:     {flops} (7.23 MFLOP)" in lines
    assert any(line.startswith(f"  bytes:     {nbytes} ") for line in lines)
    assert f"  intensity: {flops / nbytes:.4g} FLOP/B" in lines
    # The prepared form: implicit GEMM, W a reshape view, X a gather.
    i = lines.index("  prepared (implicit GEMM):")
    assert lines[i + 1] == "    Y[nhw,f] += X[nhw,crs] * W[f,crs]"
    assert lines[i + 2] == "    axes:    spatial nhw=196 f=64 | reduction crs=288"
    assert "      W  input   [64,288]  float32  (reshape of [64,32,3,3])" in lines
    assert "      X  input   [196,288]  float32  (gather of [1,32,28,28])" in lines


def test_show_matmul_has_no_prepared_form(tmp_path, capsys):
    path = _write(tmp_path, {"op": "matmul", "M": 8, "N": 8, "K": 8})
    rc, out, _ = _run(capsys, "op", "show", str(path))
    assert rc == 0
    assert "prepared" not in out
    assert "pad_value" not in out
    assert "  flops:     1024 (1.02 KFLOP)" in out.splitlines()


def test_show_fused_relu_and_pad_value(tmp_path, capsys):
    path = _write(tmp_path, MULTI)
    rc, out, _ = _run(capsys, "op", "show", str(path), "--op", "relu4")
    assert rc == 0
    assert out.startswith("op relu4 (elementwise)\n")
    assert "  prepared (fused axes):\n    Y[i0i1i2i3] = relu(X[i0i1i2i3])\n" in out
    assert "    axes:    spatial i0i1i2i3=120\n" in out
    assert "op mm" not in out
    rc, out, _ = _run(capsys, "op", "show", str(path), "--op", "pool")
    assert "  pad_value: -inf" in out.splitlines()
    assert "    X  input   [1,2,8,8]  float16" in out.splitlines()


def test_show_every_op_of_a_file(tmp_path, capsys):
    path = _write(tmp_path, MULTI)
    rc, out, _ = _run(capsys, "op", "show", str(path))
    assert rc == 0
    heads = [line for line in out.splitlines() if line.startswith("op ")]
    assert heads == ["op mm (matmul)", "op conv_s2 (conv2d)", "op relu4 (elementwise)", "op pool (generic)"]


# ---- op show, json --------------------------------------------------------------------------------------------

def test_show_json(tmp_path, capsys):
    path = _write(tmp_path, MULTI)
    rc, out, err = _run(capsys, "op", "show", str(path), "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["file"] == str(path)
    ops = {o["name"]: o for o in doc["ops"]}
    assert list(ops) == ["mm", "conv_s2", "relu4", "pool"]
    mm = ops["mm"]
    assert mm["kind"] == "matmul" and mm["expr"] == "C[m,n] += A[m,k] * B[k,n]"
    assert mm["axes"] == [{"name": "m", "extent": 128, "kind": "spatial"},
                          {"name": "n", "extent": 128, "kind": "spatial"},
                          {"name": "k", "extent": 64, "kind": "reduction"}]
    assert mm["tensors"] == [{"name": "A", "role": "input", "shape": [128, 64], "dtype": "float32"},
                             {"name": "B", "role": "input", "shape": [64, 128], "dtype": "float32"},
                             {"name": "C", "role": "output", "shape": [128, 128], "dtype": "float32"}]
    assert mm["flops"] == 2 * 128 * 128 * 64
    assert mm["bytes"] == (128 * 64 * 2 + 128 * 128) * 4
    assert mm["intensity"] == pytest.approx(mm["flops"] / mm["bytes"], abs=1e-4)
    assert mm["reduce"] == "sum" and mm["pad_value"] == 0
    assert "prepared" not in mm
    conv = ops["conv_s2"]["prepared"]
    assert conv["form"] == "implicit GEMM"
    assert [a["name"] for a in conv["axes"]] == ["nhw", "f", "crs"]
    tensors = {t["name"]: t for t in conv["tensors"]}
    assert tensors["W"]["view"] == "reshape" and tensors["W"]["storage_shape"] == [64, 32, 3, 3]
    assert tensors["X"]["view"] == "gather"
    pool = ops["pool"]
    assert pool["pad_value"] == "-inf" and pool["reduce"] == "max"
    assert pool["prepared"]["axes"][0] == {"name": "nc", "extent": 2, "kind": "spatial"}
    assert {t["dtype"] for t in pool["tensors"]} == {"float16"}
    # The hash shown is the IR's.
    from roller.ir import load_ops

    assert [o["content_hash"] for o in doc["ops"]] == [e.content_hash() for e in load_ops(path)]


def test_show_unknown_op_name(tmp_path, capsys):
    path = _write(tmp_path, MULTI)
    rc, out, err = _run(capsys, "op", "show", str(path), "--op", "relu")
    assert rc == 2 and out == ""
    assert err == (f"roller: error: {path} --op: no op named 'relu' (did you mean 'relu4'?); "
                   "the file has mm, conv_s2, relu4, pool\n")


def test_show_bad_file_is_an_input_error(tmp_path, capsys):
    path = _write(tmp_path, {"op": "matmul", "M": 4, "N": 4})
    rc, out, err = _run(capsys, "op", "show", str(path))
    assert (rc, out, err) == (2, "", f"roller: error: {path}: missing field 'K'\n")


def test_show_bad_format_option(tmp_path, capsys):
    path = _write(tmp_path, MULTI)
    with pytest.raises(SystemExit) as info:
        main(["op", "show", str(path), "--format", "yaml"])
    assert info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_op_without_action_prints_help(capsys):
    rc, out, err = _run(capsys, "op")
    assert rc == 2 and "show" in err and "check" in err


# ---- op check -------------------------------------------------------------------------------------------------

def test_check_counts_ops_per_file(tmp_path, capsys):
    one = _write(tmp_path, CONV, "one.json")
    many = _write(tmp_path, MULTI, "many.json")
    rc, out, err = _run(capsys, "op", "check", str(one), str(many))
    assert rc == 0 and err == ""
    assert out == f"{one}: 1 op OK\n{many}: 4 ops OK\n"


def test_check_examples_and_suites(capsys):
    files = sorted(EXAMPLES.glob("*.json")) + sorted((REPO / "bench" / "suites").glob("*.json"))
    if not files:
        pytest.skip("no examples or suites yet")
    rc, out, err = _run(capsys, "op", "check", *map(str, files))
    assert rc == 0, err
    assert len(out.splitlines()) == len(files)
    assert all(line.endswith(" OK") for line in out.splitlines())


def test_check_needs_a_file(capsys):
    with pytest.raises(SystemExit) as info:
        main(["op", "check"])
    assert info.value.code == 2


# ---- the installed entry point ----------------------------------------------------------------------------------

def _python_m(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "roller", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_python_m_roller_op_show_example():
    example = EXAMPLES / "conv2d_named.json"
    if not example.exists():
        pytest.skip("examples/conv2d_named.json not present")
    proc = _python_m("op", "show", "examples/conv2d_named.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("op ")
    assert "prepared (implicit GEMM)" in proc.stdout


def test_python_m_roller_op_show_json_every_example():
    examples = sorted(EXAMPLES.glob("*.json"))
    if not examples:
        pytest.skip("no examples")
    for path in examples:
        proc = _python_m("op", "show", str(path.relative_to(REPO)), "--format", "json")
        assert proc.returncode == 0, (path, proc.stderr)
        doc = json.loads(proc.stdout)
        assert doc["ops"] and all(o["flops"] > 0 and o["bytes"] > 0 for o in doc["ops"])


def test_python_m_roller_error_exit_code(tmp_path):
    bad = _write(tmp_path, {"expr": "Y[i] = X[i,k]", "shapes": {"X": [4, 5]}})
    proc = _python_m("op", "check", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"roller: error: {bad} expr: reduction index 'k'")
    assert "Traceback" not in proc.stderr
    proc = _python_m("-v", "op", "check", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["op.json"]
