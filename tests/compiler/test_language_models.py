"""Language models with their integer inputs on the device (issue 37): a small BERT (token ids, token types and
an int64 attention mask), a GPT-2 block and a Llama layer (rotary positions, grouped-query attention) with a KV
cache, built as ``torch.onnx.export`` writes them
(tests/support/language_graphs.py), compiled once and run with new token ids, masks and caches, matching
onnxruntime; through the ONNX backend too, which folds none of those inputs."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import roller
import roller.compiler.onnx_backend as backend
from roller.backends import get
from roller.errors import InputError
from tests.support.language_graphs import bert, distilbert, gpt2, llama, t5_encoder

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def _bert_feeds(seed: int, seq: int = 8, vocab: int = 60) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((1, seq), np.int64)
    mask[0, rng.integers(2, seq):] = 0   # padding at the end, as a tokenizer pads
    return {"input_ids": rng.integers(0, vocab, (1, seq)), "token_type_ids": rng.integers(0, 2, (1, seq)),
            "attention_mask": mask}


@needs_device
def test_bert_runs_on_the_device_and_new_sentences_compile_nothing() -> None:
    m = roller.compile_model(bert(), hw="pocl-cpu")
    assert m.on_device and {"input_ids", "token_type_ids", "attention_mask"} == set(m.input_names)
    gathers = [k for k in m.kernels if "gather" in k.name]
    assert gathers, "the embeddings are looked up by kernels, not folded at import"
    kernels = list(m.kernels)
    for seed in range(3):
        assert m.check(_bert_feeds(seed))["ok"]
    assert m.kernels == kernels


@needs_device
def test_gpt2_block_with_a_kv_cache_matches_onnxruntime() -> None:
    m = roller.compile_model(gpt2(), hw="pocl-cpu")
    rng = np.random.default_rng(3)
    for step in range(2):
        feeds = {"input_ids": rng.integers(0, 60, (1, 4)), "attention_mask": np.ones((1, 10), np.int64),
                 "past_key": rng.standard_normal((1, 4, 6, 8)).astype(np.float32),
                 "past_value": rng.standard_normal((1, 4, 6, 8)).astype(np.float32)}
        feeds["attention_mask"][0, :step] = 0   # the oldest cached tokens masked out
        assert m.check(feeds)["ok"]


@needs_device
@pytest.mark.parametrize("computed", [False, True], ids=["gathered", "cos-sin"])
def test_llama_layer_with_rotary_positions_and_grouped_heads_matches_onnxruntime(computed: bool) -> None:
    """The rotary tables are gathered by the run-time position ids, or computed from them with Cos and Sin:
    other positions, same build."""
    m = roller.compile_model(llama(computed_rotary=computed), hw="pocl-cpu")
    rng = np.random.default_rng(5)
    feeds = {"input_ids": rng.integers(0, 60, (1, 4)), "attention_mask": np.ones((1, 10), np.int64),
             "past_key": rng.standard_normal((1, 2, 6, 8)).astype(np.float32),
             "past_value": rng.standard_normal((1, 2, 6, 8)).astype(np.float32)}
    kernels = list(m.kernels)
    for start in (6, 0, 100):
        assert m.check(dict(feeds, position_ids=np.arange(start, start + 4).reshape(1, 4)))["ok"]
    assert m.kernels == kernels


@needs_device
def test_onnx_backend_keeps_token_ids_as_inputs() -> None:
    """Before, the backend folded every integer input into the model and evaluated the network on the host at
    each new sentence; now one compiled model takes every sentence."""
    rep = backend.prepare(bert(), "CPU")
    compiled = rep.model
    for seed in range(2):
        rep.run(_bert_feeds(seed))
    assert rep.model is compiled and compiled.on_device and rep.specialised_inputs == []


@needs_device
def test_token_ids_are_checked_and_clamped_never_read_outside() -> None:
    """An id beyond the vocabulary reads the last row (clamped, documented), a negative one counts from the end
    as ONNX's Gather does; a float array for the ids is refused in one line."""
    m = roller.compile_model(bert(), hw="pocl-cpu")
    feeds = _bert_feeds(0)
    last = dict(feeds, input_ids=np.full((1, 8), 59))
    beyond = dict(feeds, input_ids=np.full((1, 8), 10**12))
    minus_one = dict(feeds, input_ids=np.full((1, 8), -1))
    want = m.run(last)
    for other in (beyond, minus_one):
        np.testing.assert_array_equal(m.run(other)[m.output_names[0]], want[m.output_names[0]])
    with pytest.raises(InputError, match="input 'input_ids' has dtype float32, the model takes int64"):
        m.run(dict(feeds, input_ids=feeds["input_ids"].astype(np.float32)))


@needs_device
@pytest.mark.parametrize("build", [lambda: bert(open_seq=True), lambda: gpt2(open_seq=True, past=0)],
                         ids=["bert", "gpt2-prefill"])
def test_one_build_serves_every_sequence_length(build: object) -> None:
    """The length is a ``dim_param``; positions, the causal mask's rows and the reshapes follow it at run time.
    One build: a sentence of another length compiles nothing, and matches onnxruntime (GPT-2's present key and
    value, whose length is not their leading dimension, come back at the run's length)."""
    assert callable(build)
    m = roller.compile_model(build(), hw="pocl-cpu", ranges={"sequence": (1, 16)})
    assert m.mode == "generic", m.why
    compiled = m.generic.kernels_compiled
    rng = np.random.default_rng(7)
    for length in (16, 5, 1, 11):
        feeds = {"input_ids": rng.integers(0, 60, (1, length)), "attention_mask": np.ones((1, length), np.int64)}
        feeds["attention_mask"][0, :length // 3] = 0
        if "token_type_ids" in m.input_names:
            feeds["token_type_ids"] = rng.integers(0, 2, (1, length))
        report = m.check(feeds)
        assert report["ok"], report
    assert m.generic.kernels_compiled == compiled and not m.generic.per_size_compiled


@needs_device
@pytest.mark.parametrize("build", [distilbert, t5_encoder], ids=["distilbert", "t5-encoder"])
def test_distilbert_and_t5_encoders_match_onnxruntime(build: object) -> None:
    """DistilBERT's masked_fill (Equal, Expand to the scores' run-time shape, Where) and T5's relative position
    buckets (int64 Range, Abs, Log, Min, Where, gathered from the bias table): other sentences, same build."""
    assert callable(build)
    m = roller.compile_model(build(), hw="pocl-cpu")
    kernels = list(m.kernels)
    rng = np.random.default_rng(11)
    for cut in (8, 3):
        mask = np.ones((1, 8), np.int64)
        mask[0, cut:] = 0
        report = m.check({"input_ids": rng.integers(0, 60, (1, 8)), "attention_mask": mask})
        assert report["ok"], report
    assert m.kernels == kernels


@needs_device
def test_masked_scores_whose_length_axes_fuse_run_whole_at_the_greatest_length() -> None:
    """With 12 heads over lengths up to 127, construction fuses the scores' two length axes in the causal Where
    and the mask's Add, which no kernel set serves: they run their kernel built for 127 whole at every length
    (the scores held at that length's layout), and the model stays one build, matching onnxruntime."""
    m = roller.compile_model(gpt2(open_seq=True, past=0, hidden=96, heads=12), hw="pocl-cpu",
                             ranges={"sequence": (1, 127)})
    assert m.mode == "generic" and m.generic.whole, m.why
    compiled = m.generic.kernels_compiled
    rng = np.random.default_rng(5)
    for length in (127, 9, 64, 1):
        feeds = {"input_ids": rng.integers(0, 60, (1, length)), "attention_mask": np.ones((1, length), np.int64)}
        feeds["attention_mask"][0, :length // 4] = 0
        report = m.check(feeds)
        assert report["ok"], report
    assert m.generic.kernels_compiled == compiled
