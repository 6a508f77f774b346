"""bench/launch.py runs on the local PoCL device and writes a result bench/report.py reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import launch, report
from roller.backends import get

pytestmark = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())


def test_launch_costs_are_measured_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "launch-2026-01-01.json"
    assert launch.main(["--rounds", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    us = {r["what"]: r["us"] for r in doc["rows"]}
    assert len(us) == 5 and all(v > 0 for v in us.values())   # speeds go to BENCHMARKS.md, not here
    results, unread, _ = report.load(tmp_path)
    assert [r.kind for r in results] == ["launch"] and not unread
