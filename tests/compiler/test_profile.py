"""A model's profile (issue 43): every step of a run timed alone, named by what it computes, with its rate, the
model's prediction and its share, the overhead between steps, and onnxruntime's per-node profile beside it;
``roller run --profile`` prints it, and refuses it for an op."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import roller
from roller.backends import get
from roller.cli.main import main
from roller.graph.memory import KernelStep

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "examples" / "models" / "mini_resnet.onnx"


@needs_device
def test_every_step_is_timed_and_named_by_the_nodes_it_computes() -> None:
    m = roller.compile_model(MINI, hw="pocl-cpu")
    p = m.profile(repeat=3)
    assert len(p.steps) == len(m.plan.steps)
    kinds = ["kernel" if isinstance(s, KernelStep) else "copy" for s in m.plan.steps]
    assert [s.kind for s in p.steps] == kinds
    for step, row in zip(m.plan.steps, p.steps):
        assert row.seconds > 0
        if isinstance(step, KernelStep):
            assert row.name == m.by_key[step.kernel].name
            assert row.flops > 0 and row.bytes > 0 and row.predicted_s is not None
            parts = row.origin.split(" + ")
            assert all(re.fullmatch(r"node '[^']+' \(\w+\)", part) for part in parts), row.origin
            assert len(set(parts)) == len(parts)   # each node named once
    assert p.run_s > 0 and p.steps_s > 0
    # onnxruntime's nodes, from its own profiler, for the same model
    assert p.onnxruntime and all(n.seconds >= 0 and n.op_type for n in p.onnxruntime)
    assert any(n.op_type == "Conv" for n in p.onnxruntime)
    text = p.render(top=3)
    assert "each timed in chains of its own launches" in text and "onnxruntime, same inputs" in text
    gap = p.run_s - p.steps_s
    assert ("more (launch and synchronisation" if gap >= 0 else "less (the steps' samples were slower") in text
    assert f"({len(p.steps) - 3} more steps)" in text
    # the model's outputs are unchanged by the steps run again on its buffers
    feeds = m.random_inputs(1)
    fresh = roller.compile_model(MINI, hw="pocl-cpu").run(feeds)
    assert all((got == fresh[name]).all() for name, got in m.run(feeds).items())


@needs_device
def test_roller_run_profile_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--hw", "pocl-cpu", str(MINI), "--profile", "--repeat", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "each timed in chains of its own launches" in out and "GFLOP/s" in out and "onnxruntime, same inputs" in out


def test_profile_of_an_op_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--hw", "pocl-cpu", str(REPO / "examples" / "matmul.json"), "--profile"])
    err = capsys.readouterr().err
    assert rc == 2 and "--profile applies to a model" in err and len(err.strip().splitlines()) == 1
