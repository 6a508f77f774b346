"""Construction's answers are kept in the kernel cache across processes (issue 39): a second build of a model
constructs nothing, fuses, pads and packs it the same, and builds the same kernels; an entry that no longer
fits the expression is constructed again, never used."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import roller
from roller.compiler.target import Target
from roller.ir import load_op
from tests.support.zoo_graphs import ALL


def test_a_second_target_reads_the_programs_back(monkeypatch: pytest.MonkeyPatch, private_cache: Path) -> None:
    import roller.construction as construction

    op = load_op({"name": "mm_stored", "op": "matmul", "M": 96, "N": 40, "K": 24})
    first = Target.resolve("pocl-cpu", None).programs(op, 3)
    calls = []
    real = construction.construct
    monkeypatch.setattr(construction, "construct", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = Target.resolve("pocl-cpu", None).programs(op, 3)   # a new target: its own memory is empty
    assert not calls and again == first and again[0].expr.name == "mm_stored"
    assert [p.prediction.time_s for p in again] == [p.prediction.time_s for p in first]   # type: ignore[union-attr]
    # an entry edited so that it no longer describes a program of the op: constructed again
    (path,) = (private_cache / "results" / "construct").rglob("*.json")
    doc = json.loads(path.read_text())
    doc["body"][0]["op_hash"] = "0" * 16
    from roller import cache

    doc["sha256"] = cache._sha(json.dumps(doc["body"], sort_keys=True).encode())
    path.write_text(json.dumps(doc))
    assert Target.resolve("pocl-cpu", None).programs(op, 3) == first and calls


def test_a_model_built_again_constructs_nothing_and_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    import roller.construction as construction

    model = ALL["attention_block"]()[0]
    first = roller.compile_model(model, hw="h100", backend="cuda")
    calls = []
    real = construction.construct
    monkeypatch.setattr(construction, "construct", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = roller.compile_model(model, hw="h100", backend="cuda")
    assert not calls
    assert [k.artifact.source for k in second.kernels] == [k.artifact.source for k in first.kernels]
    assert second.plan.to_json() == first.plan.to_json()


def test_fusion_reads_its_costs_back_as_one_table(monkeypatch: pytest.MonkeyPatch, private_cache: Path) -> None:
    """A second fusion of a graph asks construction (or its stored answers) nothing: the costs it weighed are
    one stored table; it fuses the same. A damaged table only costs the questions again."""
    from roller.compiler.model import fuse_stage
    from roller.frontends.onnx import import_model

    graph = import_model(ALL["attention_block"]()[0])
    first, report = fuse_stage(graph, Target.resolve("pocl-cpu", None), "solver")
    asked = []
    real = Target.predicted_seconds
    monkeypatch.setattr(Target, "predicted_seconds", lambda self, e: asked.append(1) or real(self, e))
    again, again_report = fuse_stage(graph, Target.resolve("pocl-cpu", None), "solver")
    assert not asked and [n.expr.statement() for n in again.op_nodes] == [n.expr.statement() for n in first.op_nodes]
    assert report is not None and again_report is not None and again_report.predicted_s == report.predicted_s
    (table,) = (private_cache / "results" / "fusion-costs").rglob("*.json")
    table.write_text(table.read_text()[:-20])
    damaged, _ = fuse_stage(graph, Target.resolve("pocl-cpu", None), "solver")
    assert asked and [n.expr.statement() for n in damaged.op_nodes] == [n.expr.statement() for n in first.op_nodes]
