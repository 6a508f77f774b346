"""Every model of the tests' zoo, the language models and the examples, run with every buffer a run writes
filled with NaN bytes first (``ROLLER_POISON=1``): an element that a kernel or copy reads before this run wrote
it (an uninitialised border, a buffer reused across a lifetime boundary, a stale value of the previous run)
shows as NaN and fails the check against onnxruntime. The models are run twice, with other inputs the second
time, so that a value left by the first run cannot pass for this one's."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import roller
from roller.backends import get
from roller.compiler.dynamic_model import DynamicModel
from tests.support import language_graphs
from tests.support.zoo_graphs import ALL, dynamic_attention_block

CL = get("opencl")
pytestmark = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    **{f"zoo:{name}": (lambda f=f: f()[0]) for name, f in ALL.items()},
    "bert": language_graphs.bert, "distilbert": language_graphs.distilbert, "t5": language_graphs.t5_encoder,
    "gpt2": language_graphs.gpt2, "llama": language_graphs.llama,
    **{f"example:{p.stem}": (lambda p=p: onnx.load(p)) for p in sorted(EXAMPLES.glob("*.onnx"))},
}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLER_POISON", "1")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_read_of_memory_nothing_wrote(name: str) -> None:
    m = roller.compile_model(MODELS[name](), hw="pocl-cpu")
    if isinstance(m, DynamicModel):   # an open size: one of its sizes built alone (the generic run: below)
        m = m.model_at(**{s: min(3, hi) for s, (_, hi) in m.ranges.items()})
    assert m.executor.poisoned
    for seed in (0, 1):
        assert m.check(m.random_inputs(seed))["ok"]


@pytest.mark.parametrize("lengths", [(5, 2, 9)])
def test_an_open_length_poisoned(lengths: tuple[int, ...]) -> None:
    """One build over every length: buffers held at the greatest length, shorter runs poisoned around them."""
    m = roller.compile_model(dynamic_attention_block(), hw="pocl-cpu")
    assert m.mode == "generic"
    rng = np.random.default_rng(7)
    for s in lengths:
        feeds = {"x": rng.standard_normal((1, s, 64)).astype(np.float32),
                 "mask": np.zeros((1, 1, 1, s), np.float32)}
        assert m.check(feeds)["ok"]


def test_poison_is_seen() -> None:
    """The poison reaches the buffers the kernels write: NaN in every float element before a run."""
    m = roller.compile_model(ALL["classifier_head"]()[0], hw="pocl-cpu")
    ex = m.executor
    ex.poison()
    written = [b for b in ex.plan.buffers if b.role != "constant" and b.fill is None]
    assert written
    for b in written:
        out = np.empty(b.nbytes // 4, np.float32)
        ex.device.download(ex.buffers[b.id], out)
        assert np.isnan(out).all()
