"""Greedy generation with a KV cache held at the context size (roller.compiler.generation): one build of a GPT-2
decoder and a Llama layer serves every prompt and every step, the tokens and logits those of onnxruntime running
the model at the cache's true length."""
from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from roller.backends import get
from roller.compiler.generation import Generator
from roller.errors import InputError
from tests.support.language_graphs import gpt2, llama

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
CONTEXT = 12


def _greedy_without_cache(model: object, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """onnxruntime on the whole sequence at each step (no cache at all): the tokens a cache must reproduce."""
    sess = ort.InferenceSession(model.SerializeToString())  # type: ignore[attr-defined]
    tokens, scores = list(prompt), []
    for _ in range(n):
        logits = sess.run(["logits"], {"input_ids": np.array([tokens]),
                                       "attention_mask": np.ones((1, len(tokens)), np.int64)})[0][0, -1]
        scores.append(logits)
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):], scores


@needs_device
@pytest.mark.parametrize("prefill", ["none", "generic", "padded"])
def test_gpt2_generates_what_the_model_computes_without_a_cache(prefill: str) -> None:
    """Token by token through a decoder whose cache length is fixed at the context; and a prompt at once, then a
    decoder exported with its cache's length open (its causal rows cut by the past's run-time shape), which the
    generator fixes at the context. The prefill is built once over every length, or, where it would be built
    per length (here: asked to), once at the longest prompt, shorter ones padded on the right."""
    decoder = gpt2(seq=1, past=CONTEXT - 1, layers=2, position_input=True, open_past=prefill != "none")
    whole = gpt2(open_seq=True, past=0, layers=2)   # the same weights, no cache, any length
    gen = Generator(decoder, "pocl-cpu", context=CONTEXT, prefill=whole if prefill != "none" else None,
                    generic=prefill != "padded")
    assert bool(gen.prefill_why) == (prefill == "padded")
    compiled = gen.kernels_compiled
    for prompt in ([5, 7, 9], [1], list(range(3, 11))):
        n = CONTEXT - len(prompt)
        got = gen.generate(prompt, n, output_scores=True)
        tokens, scores = _greedy_without_cache(whole, prompt, n)
        assert got.tokens == tokens
        np.testing.assert_allclose(np.array(got.scores), np.array(scores), rtol=1e-4, atol=1e-4)
    assert gen.kernels_compiled == compiled   # nothing compiled after the build, at any prompt length


@needs_device
def test_llama_cache_at_the_context_size_matches_the_cache_at_its_length() -> None:
    """The Llama layer (rotary positions from position_ids, grouped-query heads) through the generator, against
    onnxruntime on the layer built with a cache exactly as long as the tokens so far at each step."""
    gen = Generator(llama(seq=1, past=CONTEXT - 1), "pocl-cpu", context=CONTEXT)
    prompt, n = [3, 14, 15], 6
    got = gen.generate(prompt, n, output_scores=True)
    tokens, scores = list(prompt), []
    key = value = np.zeros((1, 2, 0, 8), np.float32)
    for position in range(len(prompt) + n - 1):
        sess = ort.InferenceSession(llama(seq=1, past=position).SerializeToString())
        logits, key, value = sess.run(["logits", "present_key", "present_value"], {
            "input_ids": np.array([[tokens[position]]]), "attention_mask": np.ones((1, position + 1), np.int64),
            "position_ids": np.array([[position]]), "past_key": key, "past_value": value})
        if position >= len(prompt) - 1:
            scores.append(logits[0, -1])
            tokens.append(int(logits[0, -1].argmax()))
    assert got.tokens == tokens[len(prompt):]
    np.testing.assert_allclose(np.array(got.scores), np.array(scores), rtol=1e-4, atol=1e-4)


@needs_device
def test_what_the_generator_refuses() -> None:
    """A decoder whose positions come from its cache's length (the cache is read at the context size, so the
    positions would be wrong), a prompt and new tokens beyond the context, an empty prompt: one line each."""
    with pytest.raises(InputError, match="no input 'position_ids'"):
        Generator(gpt2(seq=1, past=CONTEXT - 1), "pocl-cpu", context=CONTEXT)
    with pytest.raises(InputError, match="the prefill model's length is fixed"):
        Generator(gpt2(seq=1, past=CONTEXT - 1, position_input=True), "pocl-cpu", context=CONTEXT,
                  prefill=gpt2(seq=4, past=0))
    with pytest.raises(InputError, match="context must be an integer"):
        Generator(gpt2(seq=1, past=CONTEXT - 1, position_input=True), "pocl-cpu", context=1)
    gen = Generator(gpt2(seq=1, past=CONTEXT - 1, position_input=True), "pocl-cpu", context=CONTEXT)
    with pytest.raises(InputError, match="need a context of 13; the generator was built for 12"):
        gen.generate([1, 2, 3], 10)
    with pytest.raises(InputError, match="the prompt is empty"):
        gen.generate([], 3)
    with pytest.raises(InputError, match="max_new_tokens must be a positive integer"):
        gen.generate([1], 0)
