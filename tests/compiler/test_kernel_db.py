"""``roller build --db FILE`` (a SQLite kernel database of what a build used) and ``ROLLER_KERNEL_DB`` (the
database as a tier below the cache): real builds on PoCL, each side in its own cache folder."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from roller import cache
from roller.backends import get
from roller.cli.main import main

needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())
OP = {"name": "mm", "op": "matmul", "M": 64, "N": 48, "K": 32, "dtype": "float32"}


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _created(cache_dir: Path) -> dict[str, float]:
    """Each entry's creation time from its manifest: an entry copied from the database keeps the builder's."""
    return {p.name: json.loads((p / cache.MANIFEST).read_text())["body"]["created"]
            for p in (cache_dir / "entries").iterdir()}


def _results(cache_dir: Path) -> set[tuple[str, str]]:
    return {(p.parent.parent.name, p.stem) for p in (cache_dir / "results").glob("*/*/*.json")}


def test_op_kernels_go_into_the_database_and_come_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    op, db = tmp_path / "op.json", tmp_path / "k.db"
    op.write_text(json.dumps(OP))
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    for hw in ("h200", "mi50"):            # two descriptions add to one file
        assert main(["build", str(op), "--hw", hw, "-o", str(tmp_path / f"out-{hw}"), "--db", str(db)]) == 0
    assert "2 kernels in all" in capsys.readouterr().out
    con = sqlite3.connect(db)
    rows = con.execute("SELECT op_name, description, backend, line, predicted_ms, files FROM kernels").fetchall()
    assert sorted((r[0], r[1], r[2]) for r in rows) == [("mm", "h200", "cuda"), ("mm", "mi50", "hip")]
    assert all(r[3].startswith("global>") and r[4] > 0 and "kernel." in r[5] for r in rows)
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "b"))
    monkeypatch.setenv("ROLLER_KERNEL_DB", str(db))
    assert main(["build", str(op), "--hw", "h200", "-o", str(tmp_path / "again")]) == 0
    for name in ("kernel.cu", "launch.json", "rprogram.json"):
        assert (tmp_path / "again/mm" / name).read_bytes() == (tmp_path / "out-h200/mm" / name).read_bytes()
    a, b = _created(tmp_path / "a"), _created(tmp_path / "b")
    assert b and all(a[k] == t for k, t in b.items())   # copied, not built again


@needs_cl
def test_a_model_built_from_the_database_compiles_nothing_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    model, db = _model(tmp_path / "tiny.onnx"), tmp_path / "k.db"
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    assert main(["build", str(model), "--hw", "pocl-cpu", "-o", str(tmp_path / "first"), "--db", str(db)]) == 0
    kinds = {k for (k,) in sqlite3.connect(db).execute("SELECT kind FROM results")}
    assert "opencl-program" in kinds           # the compiled program travels with its sources
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "b"))
    monkeypatch.setenv("ROLLER_KERNEL_DB", str(db))
    assert main(["build", str(model), "--hw", "pocl-cpu", "-o", str(tmp_path / "second")]) == 0
    assert main(["run", str(tmp_path / "second"), "--check"]) == 0
    a, b = _created(tmp_path / "a"), _created(tmp_path / "b")
    assert b and all(a[k] == t for k, t in b.items())
    assert _results(tmp_path / "b") <= _results(tmp_path / "a")
    capsys.readouterr()


def test_a_damaged_row_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    op, db = tmp_path / "op.json", tmp_path / "k.db"
    op.write_text(json.dumps(OP))
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    assert main(["build", str(op), "--hw", "h200", "-o", str(tmp_path / "one"), "--db", str(db)]) == 0
    con = sqlite3.connect(db)
    key, files = con.execute("SELECT key, files FROM kernels").fetchone()
    tampered = json.loads(files)
    tampered["kernel.cu"] = tampered["kernel.cu"].replace("+=", "-=", 1)   # checksums no longer match
    con.execute("UPDATE kernels SET files = ? WHERE key = ?", (json.dumps(tampered), key))
    con.commit()
    con.close()
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "b"))
    monkeypatch.setenv("ROLLER_KERNEL_DB", str(db))
    assert main(["build", str(op), "--hw", "h200", "-o", str(tmp_path / "two")]) == 0
    assert cache.last_event == "miss"
    assert (tmp_path / "two/mm/kernel.cu").read_bytes() == (tmp_path / "one/mm/kernel.cu").read_bytes()


@pytest.mark.parametrize("setup,argv,expect", [
    ("none", ["--db", "{tmp}/no/such/dir/k.db"], "--db: cannot write there"),
    ("text", ["--db", "{tmp}/k.db"], "--db: not a Roller kernel database"),
    ("none", ["--db", "{tmp}/k.db", "--no-cache"], "--db: --db copies what the build puts in the kernel cache"),
    ("none", ["--db", "{tmp}/k.db", "--dry-run"], "--dry-run builds nothing"),
])
def test_bad_db_options_are_one_line_and_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], setup: str,
                                                       argv: list[str], expect: str) -> None:
    op = tmp_path / "op.json"
    op.write_text(json.dumps(OP))
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    if setup == "text":
        (tmp_path / "k.db").write_text("not sqlite\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(["build", str(op), "--hw", "h200", "-o", str(tmp_path / "out"),
               *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    after = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("out", "a"))
    assert after == [n for n in before if n != "a"]       # no half-written database beside it
    if setup == "text":
        assert (tmp_path / "k.db").read_text() == "not sqlite\n"


def test_a_missing_or_foreign_database_setting_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    op = tmp_path / "op.json"
    op.write_text(json.dumps(OP))
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    for db in (tmp_path / "absent.db", op):
        monkeypatch.setenv("ROLLER_KERNEL_DB", str(db))
        assert main(["build", str(op), "--hw", "h200", "-o", str(tmp_path / "out")]) == 2
        assert "ROLLER_KERNEL_DB" in capsys.readouterr().err


def test_two_builds_adding_to_one_database_at_once_keep_both(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    op, db = tmp_path / "op.json", tmp_path / "k.db"
    op.write_text(json.dumps(OP))
    env = {**os.environ, "ROLLER_CACHE_DIR": str(tmp_path / "c")}
    procs = [subprocess.Popen([sys.executable, "-m", "roller", "build", str(op), "--hw", hw, "-o",
                               str(tmp_path / hw), "--db", str(db)], env=env, stdout=subprocess.DEVNULL)
             for hw in ("h200", "mi50", "v100")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    rows = sqlite3.connect(db).execute("SELECT description FROM kernels").fetchall()
    assert sorted(r[0] for r in rows) == ["h200", "mi50", "v100"]
