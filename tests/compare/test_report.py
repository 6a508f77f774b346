"""``roller compare``: every op x device in every output, numbers equal to ``roller build --dry-run``, kernels equal
to ``roller build``'s, "no backend" where none is registered, measured columns from real ``--eval`` runs, the
explanations, bad input, and atomic output."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from roller import backends
from roller.backends import get
from roller.cli.main import main
from roller.compare import report as rep
from roller.hw import load as load_hw
from roller.ir import load_ops

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "bench/suites/scaled.json"
EXAMPLES = REPO / "examples"
DEVICES = ["v100", "mi50", "ipu-gc200", "pocl-cpu"]
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())


def _main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def _small_smem_yaml(folder: Path) -> Path:
    """A new description: the V100 with a third of the shared memory per block (a --hw FILE)."""
    doc = load_hw("v100").to_dict()
    doc["name"] = "v100-16k"
    for layer in doc["memory"]:
        if layer["scope"] == "block":
            layer["capacity_per_block_bytes"] = 16 * 1024
    path = folder / "v100-16k.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("compare")
    custom = _small_smem_yaml(base)
    out = base / "report"
    argv = ["compare", str(SUITE), "-o", str(out), "--jobs", "2", "--kernels"]
    for d in DEVICES + [str(custom)]:
        argv += ["--hw", d]
    rc, text = _main(*argv)
    assert rc == 0
    assert text.startswith(f"wrote {out}/")
    return out


@pytest.fixture(scope="module")
def results(report_dir) -> dict:
    return json.loads((report_dir / "results.json").read_text())


ALL = DEVICES + ["v100-16k"]


@pytest.mark.slow
def test_every_op_and_device_in_every_output(report_dir, results):
    ops = [o.name for o in load_ops(SUITE)]
    pairs = [(o, d) for o in ops for d in ALL]
    assert [(e["op"], e["hw"]) for e in results["results"]] == pairs
    assert [d["name"] for d in results["devices"]] == ALL
    assert [o["name"] for o in results["ops"]] == ops
    with open(report_dir / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["op"], r["hw"]) for r in rows] == pairs
    assert list(rows[0]) == list(rep.CSV_COLUMNS)
    md = (report_dir / "report.md").read_text()
    table = md.split("## All results", 1)[1].strip().splitlines()[2:]
    assert [tuple(c.strip() for c in line.split("|")[1:4:2]) for line in table] == pairs
    html = (report_dir / "index.html").read_text()
    assert html.count("<tr data-i=") == len(pairs)
    assert "{{" not in html and "{%" not in html
    for section in ("Devices", "Geomean ratios", "Charts", "Rooflines", "Why decisions differ", "All results"):
        assert f">{section}</h2>" in html


def test_numbers_equal_roller_build_dry_run(results):
    entries = {(e["op"], e["hw"]): e for e in results["results"]}
    with open(REPO / "bench/suites/scaled.json") as f:
        n_ops = len(json.load(f)["ops"])
    hw_args = {d["name"]: (d["source"] or d["name"]) for d in results["devices"]}
    for hw, arg in hw_args.items():
        rc, out = _main("build", "--hw", arg, str(SUITE), "--dry-run", "--format", "json")
        assert rc == 0
        first: dict[str, dict] = {}
        for doc in json.loads(out):  # every op's top-K, best first: its first record is the top-1
            first.setdefault(doc["op"]["name"], doc)
        assert len(first) == n_ops
        for op, doc in first.items():
            e = entries[(op, hw)]
            assert e["tiles"] == doc["tiles"]
            assert (e["grid"], e["block"], e["reduce_threads"]) == (doc["grid"], doc["block"], doc["reduce_threads"])
            assert e["predicted_ms"] == doc["prediction"]["time_ms"]
            assert e["fraction_of_peak"] == doc["prediction"]["fraction_of_peak"]
            assert e["bottleneck"] == doc["prediction"]["bottleneck"]
            assert e["padding_waste"] == doc["padding_waste"]
            assert e["line"] == doc["line"]
            assert e["rprogram"] == {k: v for k, v in doc.items() if k != "op"}


def test_csv_numbers_round_trip(report_dir, results):
    with open(report_dir / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r, e in zip(rows, results["results"]):
        assert float(r["predicted_ms"]) == e["predicted_ms"]
        assert float(r["padding_waste"]) == e["padding_waste"]
        assert r["tiles"] == e["tiles_text"] and r["bottleneck"] == e["bottleneck"]


def test_kernels_equal_roller_build(report_dir, results, tmp_path):
    """The report's kernel of one op per device with a backend is the file ``roller build`` writes."""
    op = "s_matmul_prime"
    checked = 0
    for d in results["devices"]:
        e = next(x for x in results["results"] if x["op"] == op and x["hw"] == d["name"])
        if d["backend_registered"] is None:
            assert e["codegen"]["status"] == "no backend"
            continue
        assert e["codegen"]["status"] == "ok", e["codegen"]
        out = tmp_path / d["name"]
        rc, _ = _main("build", "--hw", d["source"] or d["name"], str(SUITE), "--op", op, "-o", str(out))
        assert rc == 0
        built = out / op / e["codegen"]["main_file"]
        assert (report_dir / e["codegen"]["path"]).read_text() == built.read_text()
        checked += 1
    assert checked >= 1
    # Every entry with generated code points at an existing file.
    for e in results["results"]:
        if e["codegen"]["status"] == "ok":
            assert (report_dir / e["codegen"]["path"]).is_file()


def test_codegen_status_follows_registry(results):
    for d in results["devices"]:
        hw = load_hw(d["source"] or d["name"])
        registered = hw.backend in backends.registry()
        assert (d["backend_registered"] is not None) == registered
        statuses = {e["codegen"]["status"] for e in results["results"] if e["hw"] == d["name"]}
        assert statuses <= ({"ok", "error"} if registered else {"no backend"})


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def test_geomean_ratios(results):
    base = results["baseline"]
    assert base == "v100"
    t = {(e["op"], e["hw"]): e["predicted_ms"] for e in results["results"]}
    kinds = defaultdict(list)
    for o in results["ops"]:
        kinds[o["kind"]].append(o["name"])
    rows = {r["kind"]: r for r in results["kind_ratios"]}
    assert set(rows) == set(kinds) | {"all ops"}
    kinds["all ops"] = [o["name"] for o in results["ops"]]
    for kind, ops in kinds.items():
        assert rows[kind]["ops"] == len(ops)
        for d in ALL:
            want = _geomean([t[(o, d)] / t[(o, base)] for o in ops])
            assert rows[kind]["ratio"][d] == pytest.approx(want, rel=1e-12)
        assert sum(rows[kind]["fastest"].values()) == len(ops)
    for a in ALL:
        for b in ALL:
            want = _geomean([t[(o, a)] / t[(o, b)] for o in kinds["all ops"]])
            assert results["pair_ratios"][a][b] == pytest.approx(want, rel=1e-12)


def test_why_names_the_rules_that_differ(results):
    why = {s["device"]: s for s in results["why"]}
    assert set(why) == set(ALL) - {"v100"}
    small = why["v100-16k"]
    # Only the shared-memory capacity differs from the V100: that is the first thing said, and the reason
    # given for the ops whose tiles changed.
    assert small["differences"] == ["a block may use 16KiB of shared memory on v100-16k, 48KiB of shared on v100"]
    reasons = {r["key"]: r for r in small["reasons"]}
    assert reasons["capacity"]["count"] >= 1
    assert "16KiB" in reasons["capacity"]["example"]
    changed = small["counts"]["ops"] - small["counts"]["same"]
    assert changed >= 1 and set(reasons["capacity"]["ops"]) <= {o["name"] for o in results["ops"]}
    mi50 = why["mi50"]
    assert any("64-byte transactions on mi50, 32-byte on v100" in d for d in mi50["differences"])
    assert any("wavefronts of 64 threads" in d for d in mi50["differences"])
    assert why["pocl-cpu"]["reasons"][0]["key"] == "hierarchy"


def test_why_text_in_html_and_markdown(report_dir, results):
    html = (report_dir / "index.html").read_text()
    md = (report_dir / "report.md").read_text()
    for s in results["why"]:
        assert f"{s['device']} against v100" in html and f"### {s['device']} against v100" in md
        assert s["summary"] in md
        for r in s["reasons"]:
            assert r["example"] in md


def test_rooflines_and_charts(report_dir, results):
    pytest.importorskip("matplotlib")
    names = sorted(p.name for p in (report_dir / "plots").iterdir())
    want = sorted(["time-per-op.svg", "ratio-by-kind.svg"] + [f"roofline-{d}.svg" for d in ALL])
    assert names == want
    html = (report_dir / "index.html").read_text()
    assert html.count('src="data:image/svg+xml;base64,') == len(want)
    svg = (report_dir / "plots/roofline-mi50.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "mi50 (hip gfx906)" in svg


# ---- measured columns ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    """A real ``roller build --eval`` on PoCL: pocl-cpu's own kernels, and the MI50's run through OpenCL."""
    if not get("opencl").can_run_here():
        pytest.skip(get("opencl").why_not_here())
    base = tmp_path_factory.mktemp("eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLER_CACHE_DIR", str(base / "cache"))
        rc, _ = _main("build", "--hw", "pocl-cpu", str(EXAMPLES / "multi.json"), "--eval", "--top-k", "3",
                      "--repeat", "3", "-o", str(base / "runs" / "pocl"))
        assert rc == 0
        rc, _ = _main("build", "--hw", "mi50", "--backend", "opencl", str(EXAMPLES / "matmul.json"), "--eval",
                      "--top-k", "3", "--repeat", "3", "-o", str(base / "runs" / "mi50-on-cl"))
        assert rc == 0
    return base / "runs"


@needs_cl
def test_measured_from_build_eval(evaluated, tmp_path):
    both = tmp_path / "ops.json"
    both.write_text(json.dumps({"ops": json.loads((EXAMPLES / "multi.json").read_text())["ops"]
                                + [json.loads((EXAMPLES / "matmul.json").read_text())]}))
    out = tmp_path / "r"
    rc, _ = _main("compare", "--hw", "pocl-cpu", "--hw", "mi50", str(both), "--top-k", "3",
                     "--measured", str(evaluated), "-o", str(out), "--no-plots", "--jobs", "1")
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    got = {(e["op"], e["hw"]): e for e in res["results"]}
    ops = [o.name for o in load_ops(EXAMPLES / "multi.json")]
    for op in ops:
        report = json.loads((evaluated / "pocl" / op / "report.json").read_text())
        e = got[(op, "pocl-cpu")]
        cand = next(c for c in report["candidates"] if c["line"] == e["line"])
        assert e["measured"]["measured_ms"] == cand["measured_ms"]
        assert e["measured"]["same_program"] is True and e["measured"]["comparable"] is True
        p, m = e["predicted_ms"], cand["measured_ms"]
        assert e["measured"]["model_error"] == pytest.approx(max(p / m, m / p))
    # The MI50 description's kernel timed on PoCL: shown, but no model error for the MI50.
    mi50 = got[("matmul_256", "mi50")]["measured"]
    assert mi50["comparable"] is False and mi50["model_error"] is None and mi50["backend"] == "opencl"
    assert res["measured"]["matched"] == len(ops) + 1 and res["measured"]["unmatched"] == []
    html = (out / "index.html").read_text()
    assert 'id="measured"' in html and "not mi50's own backend" in html
    assert res["device_summary"]["pocl-cpu"]["measured"] == len(ops)


@needs_cl
def test_measured_records_and_eval_json(evaluated, tmp_path):
    """A records file (bench/fidelity.py's shape) and a lone eval.json give the same columns."""
    report = json.loads((evaluated / "pocl" / "mm_128" / "report.json").read_text())
    rank1 = report["candidates"][0]
    records = tmp_path / "fid.json"
    records.write_text(json.dumps({"summary": {}, "records": [
        {"hw": "pocl-cpu", "op": "mm_128", "kind": "matmul", "measured_ms": rank1["measured_ms"],
         "predicted_ms": rank1["predicted_ms"], "candidates": [{"rank": 1, "program": rank1["line"],
                                                                 "measured_ms": rank1["measured_ms"]}]},
        {"hw": "h100", "op": "mm_128", "measured_ms": 0.01}]}))
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "eval.json").write_text((evaluated / "pocl" / "mm_128" / "eval.json").read_text())
    for src in (records, lone / "eval.json", lone):
        out = tmp_path / f"r-{src.name}"
        rc, _ = _main("compare", "--hw", "pocl-cpu", str(EXAMPLES / "multi.json"), "--op", "mm_128",
                      "--top-k", "3", "--measured", str(src), "-o", str(out), "--no-plots", "--jobs", "1")
        assert rc == 0
        res = json.loads((out / "results.json").read_text())
        e = res["results"][0]
        assert e["measured"]["measured_ms"] == next(c["measured_ms"] for c in report["candidates"]
                                                    if c["line"] == e["line"])
        assert res["measured"]["unmatched"] == (["mm_128@h100"] if src == records else [])


def test_measured_bench_gpu_rows(tmp_path):
    """bench/gpu.py --json's shape (no GPU here, so the times are written by hand): the model's top-1 time is
    used unless the report's program is the fastest one the row names."""
    progs = {}
    for d in ("v100", "a100"):
        rc, out = _main("build", "--hw", d, str(EXAMPLES / "multi.json"), "--dry-run", "--format", "json")
        assert rc == 0
        progs[d] = {}
        for doc in json.loads(out):
            progs[d].setdefault(doc["op"]["name"], doc["line"])
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"meta": {"device": "Tesla V100-SXM2-16GB", "hw": "v100"}, "rows": [
        {"name": "mm_128", "kind": "matmul", "top1_ms": 0.02, "roller_ms": 0.015, "line": "not the top-1"},
        {"name": "conv1x1", "kind": "conv2d", "top1_ms": 0.03, "roller_ms": 0.03, "line": progs["v100"]["conv1x1"]},
        {"name": "relu_1d", "kind": "elementwise", "top1_ms": None, "roller_ms": None, "error": "failed"}]}))
    out = tmp_path / "r"
    rc, _ = _main("compare", "--hw", "v100", "--hw", "a100", str(EXAMPLES / "multi.json"), "--measured", str(gpu),
                  "-o", str(out), "--no-plots", "--jobs", "1")
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    got = {(e["op"], e["hw"]): e["measured"] for e in res["results"]}
    assert got[("mm_128", "v100")]["measured_ms"] == 0.02 and got[("mm_128", "v100")]["same_program"] is False
    assert got[("conv1x1", "v100")]["measured_ms"] == 0.03 and got[("conv1x1", "v100")]["same_program"] is True
    assert got[("conv1x1", "v100")]["device"] == "Tesla V100-SXM2-16GB"
    assert got[("relu_1d", "v100")] is None and all(got[(o, "a100")] is None for o in ("mm_128", "conv1x1"))
    assert res["measured"] == {"read": 2, "matched": 2, "unmatched": []}


@pytest.mark.parametrize("doc,field", [
    ({"records": [{"hw": "v100", "op": "x", "measured_ms": -1}]}, "records[0].measured_ms"),
    ({"records": [{"hw": "v100", "measured_ms": 1.0}]}, "records[0].op"),
    ([{"hw": "v100", "op": "x"}], "[0]"),
    ({"something": 1}, "not a measured-results file"),
])
def test_bad_measured_file(tmp_path, capsys, doc, field):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "r"
    rc = main(["compare", "--hw", "v100", str(EXAMPLES / "matmul.json"), "--measured", str(bad), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(bad) in err and field in err
    assert not out.exists() and not list(tmp_path.glob(".r.tmp-*"))


# ---- input errors and output handling --------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--hw", "nope"], "nope"),
    (["--hw", "v100", "--baseline", "mi50"], "--baseline"),
    (["--hw", "v100", "--hw", "v100"], "two descriptions are named 'v100'"),
    (["--hw", "v100", "--op", "nope"], "no op named 'nope'"),
    (["--hw", "v100", "--measured", "/nonexistent/x.json"], "/nonexistent/x.json"),
])
def test_bad_input_exit_2(tmp_path, capsys, args, needle):
    out = tmp_path / "r"
    rc = main(["compare", str(EXAMPLES / "multi.json"), "-o", str(out), *args])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_output_not_replaced_when_not_a_report(tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    rc = main(["compare", "--hw", "v100", str(EXAMPLES / "matmul.json"), "-o", str(target)])
    assert rc == 2 and "holds other files than a report" in capsys.readouterr().err
    assert (target / "notes.txt").read_text() == "keep me" and len(list(target.iterdir())) == 1
    afile = tmp_path / "file"
    afile.write_text("x")
    assert main(["compare", "--hw", "v100", str(EXAMPLES / "matmul.json"), "-o", str(afile)]) == 2


def test_rerun_replaces_report_and_failure_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "r"
    rc, _ = _main("compare", "--hw", "v100", str(EXAMPLES / "multi.json"), "-o", str(out), "--no-plots",
                  "--jobs", "1", "--kernels")
    assert (out / "kernels" / "v100" / "relu_1d").is_dir()
    assert rc == 0
    rc, _ = _main("compare", "--hw", "mi50", "--hw", "v100", str(EXAMPLES / "matmul.json"), "-o", str(out),
                  "--no-plots", "--jobs", "1")
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert [(e["op"], e["hw"]) for e in res["results"]] == [("matmul_256", "mi50"), ("matmul_256", "v100")]
    assert not (out / "kernels" / "v100" / "relu_1d").exists()  # nothing left of the first report
    before = (out / "results.json").read_text()

    def broken(report):
        raise RuntimeError("disk full while writing index.html")

    monkeypatch.setattr(rep, "render_html", broken)
    with pytest.raises(RuntimeError):
        main(["compare", "--hw", "v100", str(EXAMPLES / "multi.json"), "-o", str(out), "--no-plots", "--jobs", "1"])
    assert (out / "results.json").read_text() == before  # the earlier report is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary folder left


def test_no_backend_column(tmp_path, monkeypatch):
    """With the backend serving a description unregistered, its code generation column says "no backend"."""
    ipu = load_hw("ipu-gc200")
    kept = {n: b for n, b in backends.registry().items() if ipu.backend != n}
    monkeypatch.setattr(backends, "_REGISTRY", kept)
    out = tmp_path / "r"
    rc, text = _main("compare", "--hw", "ipu-gc200", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "-o",
                     str(out), "--no-plots", "--jobs", "1")
    assert rc == 0 and "ipu-gc200    sum of predicted" in text and "codegen: no backend 1" in text
    res = json.loads((out / "results.json").read_text())
    ipu_e, cpu_e = res["results"]
    assert ipu_e["codegen"] == {"status": "no backend", "backend": None}
    assert cpu_e["codegen"]["status"] == "ok" and cpu_e["codegen"]["backend"] == "opencl"
    assert ipu_e["predicted_ms"] > 0 and ipu_e["tiles"]  # construction and the model still ran
    assert res["devices"][0]["backend_registered"] is None and "poplar" in res["devices"][0]["backend_note"]
    html = (out / "index.html").read_text()
    assert "poplar: no backend" in html and '<span class="status-none">no backend</span>' in html
    assert "no backend" in (out / "report.md").read_text()
    assert not (out / "kernels" / "ipu-gc200").exists()


def test_no_codegen_flag(tmp_path):
    out = tmp_path / "r"
    rc, _ = _main("compare", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "-o", str(out), "--no-codegen",
                  "--no-plots", "--jobs", "1")
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["results"][0]["codegen"]["status"] == "skipped" and not (out / "kernels").exists()
    out2 = tmp_path / "r2"  # code generation without --kernels: rendered, counted, not written
    rc, _ = _main("compare", "--hw", "pocl-cpu", str(EXAMPLES / "matmul.json"), "-o", str(out2), "--no-plots",
                  "--jobs", "1")
    assert rc == 0
    cg = json.loads((out2 / "results.json").read_text())["results"][0]["codegen"]
    assert cg["status"] == "ok" and cg["lines"] > 10 and cg["path"] is None and not (out2 / "kernels").exists()
    assert "plots were turned off" in (out / "index.html").read_text()


# ---- progress ----------------------------------------------------------------------------------------------------

def _run_cli(tmp_path: Path, stderr_tty: bool) -> str:
    argv = [sys.executable, "-m", "roller", "compare", "--hw", "v100", str(EXAMPLES / "matmul.json"), "-o",
            str(tmp_path / ("tty" if stderr_tty else "pipe")), "--no-plots", "--jobs", "1"]
    if not stderr_tty:
        p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stderr
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.run(argv, check=False, stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    assert p.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_only_on_a_terminal(tmp_path):
    assert _run_cli(tmp_path, stderr_tty=False) == ""
    shown = _run_cli(tmp_path, stderr_tty=True)
    assert "compare 1 ops x 1 devices [" in shown and "1/1" in shown
