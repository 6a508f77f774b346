"""bench/report.py: BENCHMARKS.md is what the script writes from bench/results/, the newest file of a kind on
a machine is the current figure, an area without results says so, and a damaged file is named in one line."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench/report.py")
report = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["bench_report"] = report   # dataclasses look their module up while the class is built
_spec.loader.exec_module(report)  # type: ignore[union-attr]


def _models(folder: Path, name: str, ratio: float, **meta: Any) -> None:
    """A bench/models.py --json file of one model whose Roller time is ``ratio`` x onnxruntime's."""
    row = {"model": "net", "hw": "pocl-cpu", "ort_ms": 10.0, "roller_ms": 10.0 * ratio, "kernels_launched": 3}
    (folder / name).write_text(json.dumps({"cpu": "Test CPU", "rows": [row], **meta}))


def _section(page: str, title: str) -> str:
    return next(s for s in page.split("\n## ") if s.startswith(title))


def test_benchmarks_md_is_what_the_script_writes() -> None:
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert page == report.render(), "BENCHMARKS.md is stale: run python bench/report.py"
    assert report.main(["--check"]) == 0


def test_the_newest_file_of_a_kind_on_each_machine_wins(tmp_path: Path) -> None:
    _models(tmp_path, "models-old-2026-01-01.json", 3.17)
    _models(tmp_path, "models-new-2026-02-01.json", 1.53, time="10:00")
    _models(tmp_path, "models-morning-2026-02-01.json", 2.22, time="08:00")   # same day, earlier
    _models(tmp_path, "models-later-2026-02-01.json", 4.44, time="11:00", before=True)   # never current
    _models(tmp_path, "models-other-2025-12-01.json", 0.87, machine="Other CPU")   # older, another machine
    models = _section(report.render(tmp_path), "Whole models")
    assert "1.53x" in models and "0.87x" in models, models
    assert not any(old in models for old in ("3.17x", "2.22x", "4.44x")), models
    assert models.index("**Test CPU") < models.index("**Other CPU"), "newest machine first"
    older = models.split("Older runs: ")[1]
    assert all(f"`models-{n}" in older for n in ("old-", "morning-", "later-")) and "models-new" not in older


def test_the_unblocked_build_gets_a_column_where_every_model_has_it(tmp_path: Path) -> None:
    row = {"model": "net", "hw": "pocl-cpu", "ort_ms": 10.0, "roller_ms": 12.0, "unblocked_ms": 13.7,
           "kernels_launched": 3}
    (tmp_path / "models-a-2026-03-01.json").write_text(json.dumps({"cpu": "Test CPU", "rows": [row]}))
    models = _section(report.render(tmp_path), "Whole models")
    assert "| top-1 / ORT | unblocked / ORT |" in models and "| 1.20x | 1.37x |" in models, models
    _models(tmp_path, "models-a-2026-03-01.json", 1.2)   # a file from before the stage: no such column
    assert "unblocked" not in _section(report.render(tmp_path), "Whole models")


def test_sources_json_supplies_what_a_file_does_not_record(tmp_path: Path) -> None:
    _models(tmp_path, "models-a.json", 1.11)
    _models(tmp_path, "models-b.json", 2.22)
    entry = {"date": "2026-03-01", "machine": "Named CPU", "command": "python bench/models.py --rounds 9"}
    (tmp_path / "sources.json").write_text(json.dumps({"files": {"models-a.json": entry}}))
    models = _section(report.render(tmp_path), "Whole models")
    assert "**Named CPU, `pocl-cpu`, 2026-03-01** (`bench/results/models-a.json`; " \
           "`python bench/models.py --rounds 9`)" in models
    assert "**Test CPU, `pocl-cpu`, undated**" in models and "2.22x" in models


def test_an_area_without_results_says_so(tmp_path: Path) -> None:
    _models(tmp_path, "models-only-2026-01-01.json", 1.5)
    page = report.render(tmp_path)
    assert "No result file yet (`bench/results/gpu-*.json`" in _section(page, "GPU")
    assert "No result file yet (`bench/results/layers-*.json`" in _section(page, "Model layers")
    assert "Not measured yet: `python bench/compile_time.py" in _section(page, "Compile time")
    assert "Only in git history" not in page   # no sources.json here: nothing to list
    rows = [{"what": "resnet18, empty caches", "seconds": 41.25, "kernels": 22}]
    (tmp_path / "compile-time-2027-01-05.json").write_text(json.dumps({"machine": "Test CPU", "rows": rows}))
    compile_time = _section(report.render(tmp_path), "Compile time")
    assert "| resnet18, empty caches | 41.2 | 22 |" in compile_time and "Not measured" not in compile_time


def test_a_damaged_file_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _models(tmp_path, "models-good-2026-01-01.json", 1.5)
    (tmp_path / "layers-cut-2026-01-02.json").write_text('[{"model": "net", "layer"')
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "B.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layers-cut-2026-01-02.json: not readable JSON" in err, err
    (tmp_path / "layers-cut-2026-01-02.json").write_text('[{"model": "net"}]')   # valid JSON, wrong shape
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "B.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layers-cut-2026-01-02.json: not a layers result" in err, err
    assert not (tmp_path / "B.md").exists()


def test_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    _models(tmp_path, "models-one-2026-01-01.json", 1.5)
    out = tmp_path / "B.md"
    args = ["--results", str(tmp_path), "--out", str(out)]
    assert report.main([*args, "--check"]) == 1   # no page yet
    assert report.main(args) == 0 and report.main([*args, "--check"]) == 0
    _models(tmp_path, "models-two-2026-01-02.json", 2.5)   # a new result, the page not regenerated
    assert report.main([*args, "--check"]) == 1
