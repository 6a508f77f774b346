"""A model build says what it is doing on a terminal (stage, kernels done / total) and nothing on a pipe."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

import roller
from roller.progress import Progress, stage

MINI = Path(__file__).resolve().parents[1] / "examples" / "models" / "mini_resnet.onnx"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_and_a_stage_on_a_terminal() -> None:
    out = Terminal()
    bar = Progress(4, "building m", stream=out)
    bar.step("conv1")
    bar.step("conv2")
    bar.close()
    with stage("fusing 26 operators", stream=out):
        pass
    text = out.getvalue()
    assert "building m [" in text and "] 2/4 conv2" in text and "fusing 26 operators ..." in text
    assert text.endswith("\r")   # erased at the end: the next line starts clean


def test_nothing_on_a_pipe() -> None:
    out = io.StringIO()
    bar = Progress(3, "building m", stream=out)
    bar.step()
    bar.close()
    with stage("fusing", stream=out):
        pass
    assert out.getvalue() == ""


@pytest.mark.parametrize("tty", [True, False])
def test_a_model_build_shows_its_stages_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    roller.compile_model(MINI, hw="pocl-cpu")
    text = err.getvalue()
    if tty:
        assert "fusing 26 operators ..." in text and "constructing 9 kernels [" in text and "] 9/9" in text
        assert "compiling 9 kernels for opencl ..." in text
    else:
        assert text == ""
