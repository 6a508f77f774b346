"""Hostile input that must end as one clean line and its exit code (2 for bad input), or as a correct run.

Issue 21, items 11-18: values of the wrong type and size in op files, expressions that are too long or too
deep, names that clash with the target languages, what the reference used to crash on, descriptions with
implausible numbers, output paths that cannot be written, interrupted builds, and the small ones.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from roller.cli.main import main
from roller.errors import CompileError, InputError
from roller.ir import load_op

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line(err: str) -> str:
    """The error of a failed command: one 'roller: error:' line (a caret line may follow it), no traceback."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and lines[0].startswith("roller: error: "), err
    assert len(lines) <= 3, err
    return lines[0]


def op_check(tmp_path: Path, capsys, doc: object, name: str = "op.json") -> tuple[int, str]:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    rc, out, err = cli(capsys, "op", "check", str(path))
    return rc, (out if rc == 0 else one_line(err))


MATMUL = {"op": "matmul", "M": 4, "N": 4, "K": 4}


# ---- 11: op check used to give tracebacks ----------------------------------------------------------------------

@pytest.mark.parametrize("field,value,expect", [
    ("op", ["matmul"], "op: expected an op name (string), got ['matmul']"),
    ("op", {"kind": "matmul"}, "op: expected an op name (string)"),
    ("dtype", {"a": 1}, "dtype: expected one of float64, float32, float16, bfloat16, int64, int32, int8, uint8, bool, got {'a': 1}"),
    ("dtype", ["float32"], "dtype: expected one of float64, float32, float16, bfloat16"),
    ("dtypes", {"A": ["x"]}, "dtypes.A: expected one of float64, float32, float16, bfloat16, int64, int32, int8, uint8, bool, got ['x']"),
    ("dtypes", ["float16"], "dtypes: expected an object of tensor: dtype"),
])
def test_wrong_types_of_op_fields(tmp_path, capsys, field, value, expect) -> None:
    rc, line = op_check(tmp_path, capsys, {**MATMUL, field: value})
    assert rc == 2 and expect in line, line


@pytest.mark.parametrize("perm", [[1.0, 0], [1, 0.0], ["1", 0], [True, False], [1, True], [0, 0], [0, 2]])
def test_perm_must_be_integers_forming_a_permutation(tmp_path, capsys, perm) -> None:
    rc, line = op_check(tmp_path, capsys, {"op": "transpose", "shape": [2, 3], "perm": perm})
    assert rc == 2 and "perm: expected a permutation of 0..1" in line


def test_integers_of_thousands_of_digits(tmp_path, capsys) -> None:
    rc, line = op_check(tmp_path, capsys, '{"op": "matmul", "M": ' + "9" * 5000 + ', "N": 4, "K": 4}')
    assert rc == 2 and "an integer of 5000 digits (at most 40)" in line
    # Forty digits pass the reader and fail as a size: the limit is the reader's, the check is the field's.
    rc, line = op_check(tmp_path, capsys, '{"op": "matmul", "M": ' + "9" * 40 + ', "N": 4, "K": 4}')
    assert rc == 2 and "more than 2^31-1" in line


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_json_nested_deeply(tmp_path, capsys, depth) -> None:
    rc, line = op_check(tmp_path, capsys, '{"op": "matmul", "M": 4, "N": 4, "K": 4, "comment": '
                        + "[" * depth + "]" * depth + "}")
    assert rc == 2 and "nested" in line and "levels deep" in line


def test_json_nesting_within_the_limit_is_fine(tmp_path, capsys) -> None:
    rc, _ = op_check(tmp_path, capsys, '{"op": "matmul", "M": 4, "N": 4, "K": 4, "comment": '
                     + "[" * 30 + "]" * 30 + "}")
    assert rc == 0


@pytest.mark.parametrize("depth", [33, 246, 5000])
def test_nested_parentheses(tmp_path, capsys, depth) -> None:
    doc = {"expr": "Y[i] = " + "(" * depth + "X[i]" + ")" * depth, "shapes": {"X": [4], "Y": [4]}}
    rc, line = op_check(tmp_path, capsys, doc)
    assert rc == 2 and "brackets and function calls nest more than 32 deep" in line


def test_nested_calls_and_signs(tmp_path, capsys) -> None:
    for text in ("exp(" * 40 + "X[i]" + ")" * 40, "-" * 500 + "X[i]"):
        rc, line = op_check(tmp_path, capsys, {"expr": "Y[i] = " + text, "shapes": {"X": [4]}})
        assert rc == 2 and "nest more than 32 deep" in line, line


def test_large_op_files_are_bounded(tmp_path, capsys) -> None:
    big = tmp_path / "big.json"
    with open(big, "w") as fh:  # a 1.7 M-op file, as the audit tried: over the size limit, refused unread
        fh.write('{"ops": [' + ",".join(['{"op": "matmul", "M": 4, "N": 4, "K": 4}'] * 220_000) + "]}")
    rc, _out, err = cli(capsys, "op", "check", str(big))
    assert rc == 2 and "op file is larger than 8 MiB" in one_line(err)
    many = {"ops": [{"name": f"m{i}", **MATMUL} for i in range(10_001)]}
    rc, line = op_check(tmp_path, capsys, many)
    assert rc == 2 and "10001 ops in one file, more than 10000" in line


def test_long_expressions_are_bounded(tmp_path, capsys) -> None:
    terms = " + ".join(["X[i]"] * 4000)  # 28 K characters
    rc, line = op_check(tmp_path, capsys, {"expr": "Y[i] = " + terms, "shapes": {"X": [4]}})
    assert rc == 2 and "characters long, more than 20000" in line


# ---- 12: accepted by op check, then failing later ---------------------------------------------------------------

@pytest.mark.parametrize("n", [300, 600, 1500])
def test_long_sums_build_show_and_run(tmp_path, capsys, n) -> None:
    doc = {"name": "longsum", "expr": "Y[i] = " + " + ".join(f"X[i] * {k % 7 + 1}" for k in range(n)),
           "shapes": {"X": [5]}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    assert cli(capsys, "op", "check", str(path))[0] == 0
    rc, out, err = cli(capsys, "op", "show", str(path))
    assert rc == 0 and "longsum" in out, err
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(path), "--check", "--no-cache")
    assert rc == 0 and "check ok" in out, err


def test_long_sums_keep_their_value_and_signs() -> None:
    from roller.ir.reference import reference

    terms = [f"{'-' if k % 3 == 0 else '+'} X[i] * {k}" for k in range(1, 200)]
    op = load_op({"expr": "Y[i] = X[i] " + " ".join(terms), "shapes": {"X": [3]}})
    x = np.arange(3, dtype=np.float32) + 1
    want = x * (1 + sum(-k if k % 3 == 0 else k for k in range(1, 200)))
    np.testing.assert_allclose(reference(op, {"X": x}), want, rtol=1e-6)


@pytest.mark.parametrize("name,kind", [("FLT_MAX", "a macro"), ("NULL", "a macro"), ("CLK_LOCAL_MEM_FENCE", "a macro"),
                                       ("half2", "a type"), ("float4", "a reserved word"), ("size_t", "a reserved word"),
                                       ("fabs", "a function generated kernels call"), ("isnan", "a function"),
                                       ("get_group_id", "a reserved word"), ("vload8", "a function")])
def test_tensor_names_that_clash_with_a_target(tmp_path, capsys, name, kind) -> None:
    rc, line = op_check(tmp_path, capsys, {"expr": f"Y[i] = {name}[i]", "shapes": {name: [4]}})
    assert rc == 2 and f"{name!r} is {kind}" in line, line


@pytest.mark.parametrize("name", ["mix", "dot", "gamma", "length", "sqrtf", "atomicAdd", "printf", "hipMalloc"])
def test_op_names_that_clash_with_a_target(tmp_path, capsys, name) -> None:
    rc, line = op_check(tmp_path, capsys, {"name": name, **MATMUL})
    assert rc == 2 and "ops name their kernels" in line, line


def test_names_the_kernels_do_not_call_are_fine(tmp_path, capsys) -> None:
    """A tensor may hide a global function the kernel never calls (fmax, gamma), and an op may be named like a
    pyopencl Program attribute: both build and run on every backend here."""
    doc = {"name": "build", "expr": "Y[i] += fmax[i,k] * gamma[k] + max(gamma[k], 0.0)",
           "shapes": {"fmax": [5, 3], "gamma": [3]}}
    path = tmp_path / "n.json"
    path.write_text(json.dumps(doc))
    for hw in ("pocl-cpu", "v100", "ipu-gc200"):
        rc, out, err = cli(capsys, "run", "--hw", hw, "--backend", "opencl", str(path), "--check", "--no-cache")
        assert rc == 0 and "check ok" in out, err


def test_reserved_list_covers_the_target_headers() -> None:
    """The committed list (scripts/reserved_names.py) holds what the issue named, in every category."""
    from roller.ir.identifiers import target_names

    names = target_names()
    assert {n: names.get(n) for n in ("FLT_MAX", "NULL", "CLK_LOCAL_MEM_FENCE", "half2", "fmax", "cudaSuccess",
                                      "hipMalloc", "nv_bfloat16")} == {
        "FLT_MAX": "macro", "NULL": "macro", "CLK_LOCAL_MEM_FENCE": "macro", "half2": "type", "fmax": "function",
        "cudaSuccess": "enumerator", "hipMalloc": "function", "nv_bfloat16": "type"}
    for common in ("X", "W", "A", "bias", "weight", "input", "output", "x", "y", "data", "mask", "src", "beta"):
        assert common not in names, common


# ---- 13: --check crashing inside roller.reference ---------------------------------------------------------------

@pytest.mark.parametrize("doc", [
    {"name": "bcast", "expr": "Y[i,j] = X[i]", "shapes": {"X": [4], "Y": [4, 3]}},
    {"name": "div0", "expr": "Y[i] = X[i] / 0", "shapes": {"X": [4]}},
    {"name": "div0sum", "expr": "Y[i] += X[i,k] / 0", "shapes": {"X": [4, 3]}},
    {"name": "negzero", "expr": "Y[i] = X[i] / -0.0", "shapes": {"X": [4]}},
])
def test_reference_cases_run_and_check(tmp_path, capsys, doc) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(path), "--check", "--no-cache")
    assert rc == 0 and "check ok" in out, err


@pytest.mark.parametrize("expr", ["Y[i] = X[99999999999999999999*i]", "Y[i] = X[i + 99999999999999999999]",
                                  "Y[i] = X[4611686018427387904*i]", "Y[i] = X[-9223372036854775808 + i]"])
def test_index_constants_beyond_64_bits(tmp_path, capsys, expr) -> None:
    rc, line = op_check(tmp_path, capsys, {"expr": expr, "shapes": {"X": [4], "Y": [4]}})
    assert rc == 2 and ("64-bit" in line), line


# ---- 14: IPU descriptions without a program ---------------------------------------------------------------------

@pytest.mark.parametrize("hw,doc", [
    ("ipu-gc200", {"op": "reduce", "kind": "sum", "shape": [262144], "axes": [0]}),
    ("ipu-gc200", {"op": "reduce", "kind": "max", "shape": [2, 400000], "axes": [1]}),
    ("ipu-gc2", {"op": "matmul", "M": 4, "N": 4, "K": 1048576}),
])
def test_ipu_without_a_program(tmp_path, capsys, hw, doc) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    for argv in (["build", "--hw", hw, str(path), "-o", str(tmp_path / "out")],
                 ["build", "--hw", hw, str(path), "--dry-run"],
                 ["run", "--hw", hw, "--backend", "opencl", str(path)]):
        rc, out, err = cli(capsys, *argv)
        assert rc == 2 and out == "", argv
        assert "no program fits" in one_line(err) and "whole reduction" in err
    assert not (tmp_path / "out").exists()


# ---- 15: implausible physical quantities ------------------------------------------------------------------------

def _variant(tmp_path: Path, name: str, edit) -> Path:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((ROOT / "roller/hwdesc/v100.yaml").read_text())
    doc["name"] = name
    edit(doc)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _bandwidth(value: float):  # type: ignore[no-untyped-def]
    def edit(doc: dict) -> None:
        for m in doc["memory"]:
            m["bandwidth_gbps"] = {"peak": value, "effective": value}
    return edit


def _tflops(value: float):  # type: ignore[no-untyped-def]
    def edit(doc: dict) -> None:
        for c in doc["compute"].values():
            for kind in ("vector", "matrix"):
                if c.get(kind):
                    c[kind] = {"peak_tflops": value, "effective_tflops": value}
    return edit


@pytest.mark.parametrize("edit,field", [
    (_bandwidth(1e-300), "bandwidth_gbps.peak"), (_bandwidth(1e308), "bandwidth_gbps.peak"),
    (_tflops(1e-300), "peak_tflops"), (_tflops(1e300), "peak_tflops"),
    (lambda d: d["parallelism"].update(compute_units=2**40), "compute_units"),
    (lambda d: d["memory"][0].update(capacity_bytes=2**62), "capacity_bytes"),
    (lambda d: d.update(calibration={"launch_us": 1e300}), "launch_us"),
])
def test_implausible_quantities_fail_validate_build_and_compare(tmp_path, capsys, edit, field) -> None:
    path = _variant(tmp_path, "odd", edit)
    rc, _, err = cli(capsys, "hw", "validate", str(path))
    assert rc == 2 and field in one_line(err) and "a plausible value for any device" in err
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps(MATMUL))
    for argv in (["build", "--hw", str(path), str(ops), "--dry-run"],
                 ["compare", "--hw", "v100", "--hw", str(path), str(ops), "-o", str(tmp_path / "r"), "-j", "1"]):
        rc, _out, err = cli(capsys, *argv)
        assert rc == 2 and field in one_line(err), argv


def test_quantities_at_the_edges_of_the_ranges_compare(tmp_path, capsys) -> None:
    """What validate accepts, compare builds: the ranges' ends, where the model's arithmetic is most strained."""
    paths = [_variant(tmp_path, "bwlo", _bandwidth(1e-3)), _variant(tmp_path, "bwhi", _bandwidth(1e8)),
             _variant(tmp_path, "tflo", _tflops(1e-6)), _variant(tmp_path, "tfhi", _tflops(1e6)),
             _variant(tmp_path, "cu1", lambda d: d["parallelism"].update(compute_units=1)),
             _variant(tmp_path, "cuhi", lambda d: d["parallelism"].update(compute_units=2**24)),
             _variant(tmp_path, "cal", lambda d: d.update(calibration={
                 "launch_us": 1e7, "per_block_us": 1e-6, "join_us": 1e7,
                 "register_tile_gflops": [{"rows": 1, "cols": 1, "gflops": 1e-6}]}))]
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps({"ops": [{"name": "mm", **MATMUL},
                                       {"name": "rd", "op": "reduce", "kind": "sum", "shape": [64, 100], "axes": [1]},
                                       {"name": "el", "op": "elementwise", "fn": "relu", "shapes": {"X": [999]}}]}))
    argv = ["compare"] + [a for p in paths for a in ("--hw", str(p))] + [str(ops), "-o", str(tmp_path / "r"),
                                                                         "-j", "1", "--no-plots"]
    rc, _out, err = cli(capsys, *argv)
    assert rc == 0, err
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    times = [e["predicted_ms"] for e in results["results"]]
    assert len(times) == 3 * len(paths) and all(np.isfinite(t) and t > 0 for t in times)


def test_validate_requires_what_construction_needs(tmp_path, capsys) -> None:
    def two_layers(doc: dict) -> None:
        doc["memory"] = [doc["memory"][0], doc["memory"][-1]]
    path = _variant(tmp_path, "flat", two_layers)
    rc, _out, err = cli(capsys, "hw", "validate", str(path))
    assert rc == 2 and "expected a 'block' layer" in one_line(err)


# ---- 16: output paths, input arrays, the cache ------------------------------------------------------------------

RELU = {"name": "relu1", "op": "elementwise", "fn": "relu", "shapes": {"X": [3, 5]}}


def _relu_file(tmp_path: Path) -> Path:
    path = tmp_path / "relu.json"
    path.write_text(json.dumps(RELU))
    return path


def test_save_onto_a_folder(tmp_path, capsys) -> None:
    (tmp_path / "outdir").mkdir()
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)), "--save",
                       str(tmp_path / "outdir"))
    assert rc == 2 and out == "" and "--save: is a folder" in one_line(err)


def test_save_into_an_unwritable_folder(tmp_path, capsys, monkeypatch) -> None:
    """Refused before running anything (as root the permission bits do not bind, so access() is what says)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro.resolve() else real(p, mode, **kw))
    rc, out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)), "--save", str(ro / "o.npz"))
    assert rc == 2 and out == "" and "cannot write there" in one_line(err)


def test_save_write_failure_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    import roller.cli.common

    def denied(*a, **kw):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(roller.cli.common, "write_atomic", denied)
    rc, _out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)), "--save",
                       str(tmp_path / "o.npz"), "--no-cache")
    assert rc == 2 and "cannot write there: Permission denied" in one_line(err)


@pytest.mark.parametrize("arr", [np.array(["a", "b"]), np.zeros((3, 5), dtype=complex), np.zeros((3, 5), dtype="M8[s]")])
def test_inputs_that_are_not_real_numbers(tmp_path, capsys, arr) -> None:
    np.savez(tmp_path / "in.npz", X=arr)
    rc, _out, err = cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)), "--inputs",
                       str(tmp_path / "in.npz"))
    assert rc == 2 and "expected real numbers" in one_line(err)


def test_cache_clear_that_cannot_remove(tmp_path, capsys, monkeypatch) -> None:
    import roller.cache

    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache"))
    assert cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)))[0] == 0
    monkeypatch.setattr(roller.cache, "remove", lambda folder: False)
    rc, out, err = cli(capsys, "cache", "clear")
    assert rc == 2 and out == ""
    assert "removed 0 cache entries, but 1 could not be removed" in one_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not bind root")
def test_cache_clear_on_a_read_only_cache(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache"))
    assert cli(capsys, "run", "--hw", "pocl-cpu", str(_relu_file(tmp_path)))[0] == 0
    entries = tmp_path / "cache" / "entries"
    entries.chmod(0o555)
    try:
        rc, _out, err = cli(capsys, "cache", "clear")
    finally:
        entries.chmod(0o755)
    assert rc == 2 and "could not be removed" in one_line(err)


# ---- 17: interrupted builds -------------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_staging_folders_are_swept(tmp_path, capsys) -> None:
    op = tmp_path / "op.json"
    op.write_text(json.dumps({"name": "mm", **MATMUL}))
    out = tmp_path / "out"
    assert cli(capsys, "build", "--hw", "pocl-cpu", str(op), "-o", str(out))[0] == 0
    # What a SIGKILL between the two renames of the fallback leaves: the earlier build of 'mm2' moved aside in
    # the killed run's folder, nothing at out/mm2. And a folder from before pids were in the names.
    stale = tmp_path / f".out.tmp-{_dead_pid()}-abc"
    (stale / ".old-mm2").mkdir(parents=True)
    (stale / ".old-mm2" / "kernel.cl").write_text("// the earlier mm2")
    legacy = tmp_path / ".out.tmp-zz9"
    legacy.mkdir()
    os.utime(legacy, (0, 0))
    live = tmp_path / f".out.tmp-{os.getpid()}-live"
    live.mkdir()
    assert cli(capsys, "build", "--hw", "pocl-cpu", str(op), "-o", str(out))[0] == 0
    assert (out / "mm2" / "kernel.cl").read_text() == "// the earlier mm2"
    assert not stale.exists() and not legacy.exists()
    assert live.exists()  # its owner (this process) still runs
    assert sorted(p.name for p in tmp_path.glob(".out.tmp-*")) == [live.name]


def test_killed_build_leaves_a_folder_the_next_one_removes(tmp_path) -> None:
    """A real SIGKILL during a build: its staging folder stays, the next build into the same folder removes it."""
    op = tmp_path / "op.json"
    op.write_text(json.dumps({"ops": [{"name": f"c{i}", "op": "conv2d", "N": 1, "C": 16, "H": 14, "W": 14, "F": 16,
                                       "KH": 3, "KW": 3} for i in range(40)]}))
    env = dict(os.environ, ROLLER_NO_CACHE="1")
    cmd = [sys.executable, "-m", "roller", "build", "--hw", "v100", str(op), "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):  # wait for its staging folder to appear, then kill it mid-build
        if list(tmp_path.glob(".out.tmp-*")) or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"name": "mm", **MATMUL}))
    done = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "pocl-cpu", str(small), "-o",
                           str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_moving_into_place_swaps_in_one_step(tmp_path) -> None:
    from roller.compiler.artifact import move_into_place

    out, tmp = tmp_path / "out", tmp_path / ".out.tmp-1-x"
    (out / "op").mkdir(parents=True)
    (out / "op" / "kernel.cl").write_text("old")
    (tmp / "op").mkdir(parents=True)
    (tmp / "op" / "kernel.cl").write_text("new")
    move_into_place(tmp, out, ["op"])
    assert (out / "op" / "kernel.cl").read_text() == "new"


# ---- 18: the small ones ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc,expect", [
    ('{"op": "matmul", "M": 4, "N": 4, "K": 4, "M": 5}', "duplicate key 'M' in one object"),
    ({**MATMUL, "dtypes": {"Z": "float16"}}, "dtypes.Z: tensor 'Z' does not appear in the expression"),
    ({"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "extents": {"q": 3}}, "extents.q: axis 'q' does not appear"),
    ({"op": "reduce", "shape": [2, 3], "axes": [1, 1]}, "axes[1]: axis 1 is listed twice"),
    ({"op": "reduce", "shape": [2, 3], "axes": [1, -1]}, "axes[1]: axis -1 is listed twice (as 1)"),
    ({"expr": "Y[i] = X[i+\u0663]", "shapes": {"X": [4], "Y": [4]}}, "unexpected character"),
    ({"expr": "Y[i] = X[i+\uff11]", "shapes": {"X": [4], "Y": [4]}}, "unexpected character"),
    ('{"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]}, "pad_value": NaN}', "NaN is not a JSON number"),
    ('{"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]}, "pad_value": Infinity}', "Infinity is not a JSON"),
    ('{"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]}, "pad_value": 1e400}', "within float32's range"),
    ({"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]}, "pad_value": 3.5e38}, "within float32's range"),
    ({"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]}, "pad_value": "NaN"}, "expected a number"),
])
def test_small_ones_in_op_files(tmp_path, capsys, doc, expect) -> None:
    rc, line = op_check(tmp_path, capsys, doc)
    assert rc == 2 and expect in line, line


def test_pad_value_at_float32_max_is_fine(tmp_path, capsys) -> None:
    rc, _ = op_check(tmp_path, capsys, {"expr": "Y[i] = X[i+1]", "shapes": {"X": [4], "Y": [4]},
                                        "pad_value": 3.4028234663852886e38})
    assert rc == 0


@pytest.mark.parametrize("text", [
    "name: !!python/object/apply:os.system ['echo pwned']\n",
    "name: x\nmemory: !!python/object/new:list [[]]\n",
    "name: x\nmemory: !!set {a, b}\n",
    "name: !!python/name:os.system x\n",
])
def test_python_tags_in_descriptions(tmp_path, capsys, text) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text(text)
    rc, _out, err = cli(capsys, "hw", "validate", str(path))
    assert rc == 2 and "invalid YAML" in one_line(err) and ("tag" in err or "constructor" in err)


def test_probe_name_is_checked_before_probing(tmp_path, capsys, monkeypatch) -> None:
    from roller.backends.opencl import probe

    def never(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("probed before checking --name")
    monkeypatch.setattr(probe, "probe", never)
    for name in ("\u00e9", "a b", "-x", "x/y"):
        rc, _out, err = cli(capsys, "hw", "probe", "--quick", f"--name={name}", "-o", str(tmp_path / "p.yaml"))
        assert rc == 2 and "--name: expected a name of ASCII letters" in one_line(err)
    from roller.hw.loader import NAME_RE

    assert NAME_RE.fullmatch(probe.description_name("\u00e9t\u00e9-cpu"))


def test_opencl_compile_failure_repro_is_quoted_and_leaves_no_folder(tmp_path, monkeypatch) -> None:
    from roller.backends import Artifact, get
    from roller.construction import construct
    from roller.hw import load

    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache dir $HOME 'q'"))
    op = load_op({"name": "mm", **MATMUL})
    hw = load("pocl-cpu")
    be = get("opencl")
    art = be.render(construct(op, hw, top_k=1)[0], hw)
    broken = Artifact(art.kernel_name, {art.main_file: art.source + "\nint rl_broken = ;\n"}, art.launch,
                      art.main_file)
    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(CompileError) as info:
        be.compile(broken, hw)
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("roller-cl-")} == set()
    text = str(info.value)
    kernel = Path(text.split("\nkernel: ")[1].splitlines()[0])
    assert kernel.read_text() == broken.source and kernel.parent == tmp_path / "cache dir $HOME 'q'" / "failed"
    repro = text.split("\nrepro: ")[1].splitlines()[0]
    argv = shlex.split(repro)  # a shell reads the path back exactly, quotes, dollars and spaces included
    assert argv[:2] == ["python", "-c"] and repr(str(kernel)) in argv[2]
    with pytest.raises(CompileError):  # the same failure again: the same file, no second one
        be.compile(broken, hw)
    assert len(list(kernel.parent.iterdir())) == 1


def test_bad_inputs_to_the_api_are_input_errors() -> None:
    from roller.ir import parse_ops

    for doc in ({**MATMUL, "dtype": ["float32"]}, {"op": ["matmul"]}, {"expr": "Y[i] = X[i]",
                                                                       "shapes": {"X": [4]}, "pad_value": float("nan")},
                {"expr": "Y[i] = X[1000000000000000000000000000000*i]", "shapes": {"X": [4]}}):
        with pytest.raises(InputError):
            parse_ops(doc, None)
