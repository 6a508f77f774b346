"""Greedy generation with a KV cache, built once: the small GPT-2 of examples/models (make_examples.py), its
decoder with past key values built for a context of 32 positions and its cache-less form for the prompt.

    .venv/bin/python examples/generate.py [--hw pocl-cpu] [--prompt 5,7,9] [--max-new-tokens 12]

Prints the new tokens, the time each part took, and whether onnxruntime (if installed), running the whole
sequence at every step without a cache, picks the same tokens. The same with the command line:

    roller generate examples/models/mini_gpt2_decoder.onnx --hw pocl-cpu --context 32 --prompt 5,7,9 \\
        --prefill examples/models/mini_gpt2.onnx
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parent / "models"


def without_cache(model: Path, prompt: list[int], n: int) -> list[int] | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    tokens = list(prompt)
    for _ in range(n):
        logits = sess.run(["logits"], {"input_ids": np.array([tokens]),
                                       "attention_mask": np.ones((1, len(tokens)), np.int64)})[0]
        tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt):]


def main() -> int:
    from roller.compiler.generation import Generator

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hw", default="pocl-cpu")
    parser.add_argument("--prompt", default="5,7,9")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    gen = Generator(MODELS / "mini_gpt2_decoder.onnx", args.hw, context=32, prefill=MODELS / "mini_gpt2.onnx")
    built = gen.kernels_compiled
    print(f"built in {gen.build_s:.1f} s: {built} kernels")
    out = gen.generate(prompt, args.max_new_tokens)
    print("tokens:", " ".join(map(str, out.tokens)))
    print(f"prompt in {out.prompt_s * 1e3:.1f} ms, then {out.tokens_per_s:.0f} tokens/s; "
          f"kernels compiled since the build: {gen.kernels_compiled - built}")
    want = without_cache(MODELS / "mini_gpt2.onnx", prompt, args.max_new_tokens)
    if want is not None:
        print("onnxruntime without a cache:", "the same tokens" if want == out.tokens else f"other tokens {want}")
        return 0 if want == out.tokens else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
