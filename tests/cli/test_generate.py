"""``roller generate``: the example GPT-2's decoder built once for its context, a prompt run at once through its
cache-less form, the tokens those of onnxruntime without a cache; bad options in one line, exit 2."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roller.backends import get
from roller.cli.main import main

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())


@needs_cl
def test_generate_prints_the_tokens_onnxruntime_picks(capsys: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")
    prompt = [5, 7, 9, 11, 2]
    rc = main(["generate", str(MODELS / "mini_gpt2_decoder.onnx"), "--hw", "pocl-cpu", "--context", "32",
               "--prompt", ",".join(map(str, prompt)), "--max-new-tokens", "6",
               "--prefill", str(MODELS / "mini_gpt2.onnx")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    sess = ort.InferenceSession(str(MODELS / "mini_gpt2.onnx"))
    tokens = list(prompt)
    for _ in range(6):
        logits = sess.run(["logits"], {"input_ids": np.array([tokens]),
                                       "attention_mask": np.ones((1, len(tokens)), np.int64)})[0]
        tokens.append(int(logits[0, -1].argmax()))
    assert out[0] == " ".join(map(str, tokens[len(prompt):]))
    assert "prompt of 5 tokens" in out[1]


@pytest.mark.parametrize("argv, message", [
    (["--context", "32", "--prompt", "1,x"], "expected token ids separated by commas"),
    (["--context", "16", "--prompt", "1"], "holds 31 cache positions (fixed in the model): the context is then 32"),
    (["--context", "32", "--prompt", "1,2", "--max-new-tokens", "31"], "need a context of 33"),
    (["--context", "32", "--prompt", "1", "--prefill", "no-such.onnx"], "no-such.onnx: no such model file"),
])
def test_bad_options_exit_2_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    if "--max-new-tokens" in argv and not get("opencl").can_run_here():
        pytest.skip(get("opencl").why_not_here())
    try:
        rc = main(["generate", str(MODELS / "mini_gpt2_decoder.onnx"), "--hw", "pocl-cpu", *argv])
    except SystemExit as stop:   # argparse's own errors
        rc = int(stop.code or 0)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
