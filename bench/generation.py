"""Greedy generation with a KV cache on this machine's OpenCL device against onnxruntime, same process (issue 37).

    .venv/bin/python bench/generation.py [--layers 12] [--context 128] [--prompt 32] [--new 32] [--rounds 3]
                                         [--json OUT]

GPT-2 small's structure with random weights (``tests/support/language_graphs.py``: hidden 768, 12 heads,
vocabulary 50,257, ``--layers`` blocks), exported twice as Optimum writes a causal LM: without a cache, its length
open (the prefill), and as the decoder with past key values, the cache's length open. Roller builds the decoder
once at ``--context`` positions (``roller.compiler.generation.Generator``: a static cache masked by the attention
mask) and the prefill once over every prompt length; onnxruntime (all graph optimisations, 2 intra-op threads)
runs the same two models with the cache growing a position a step, as ``transformers`` does. Each round
generates ``--new`` tokens from one ``--prompt``-token prompt with each, alternating which goes first; the
tokens must agree. Reported: build time (first, with this process's kernel cache as it is), the prompt's time and
the median time of a new token for each, and kernels compiled after the build (zero).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.layers import ort_session
from bench.models import cpu_name
from tests.support.language_graphs import gpt2

VOCAB, HIDDEN, HEADS = 50257, 768, 12


def ort_generate(prefill: Any, decoder: Any, prompt: list[int], n: int) -> tuple[list[int], float, list[float]]:
    """Greedy decoding with onnxruntime, the cache growing a position a step: tokens, prompt s, step s."""
    names = [o.name for o in prefill.get_outputs()]
    t = time.perf_counter()
    out = dict(zip(names, prefill.run(None, {"input_ids": np.array([prompt]),
                                             "attention_mask": np.ones((1, len(prompt)), np.int64)})))
    prompt_s = time.perf_counter() - t
    tokens = [int(out["logits"][0, -1].argmax())]
    steps = []
    while len(tokens) < n:
        p = len(prompt) + len(tokens) - 1
        feeds = {"input_ids": np.array([[tokens[-1]]]), "position_ids": np.array([[p]]),
                 "attention_mask": np.ones((1, p + 1), np.int64)}
        feeds.update({name.replace("present", "past"): out[name] for name in names[1:]})
        t = time.perf_counter()
        out = dict(zip(names, decoder.run(None, feeds)))
        steps.append(time.perf_counter() - t)
        tokens.append(int(out["logits"][0, -1].argmax()))
    return tokens, prompt_s, steps


def measure(hw: str, layers: int, context: int, prompt_len: int, new: int, rounds: int) -> dict[str, Any]:
    from roller.compiler.generation import Generator

    shape = {"vocab": VOCAB, "hidden": HIDDEN, "heads": HEADS, "layers": layers}
    prefill = gpt2(open_seq=True, past=0, **shape)
    decoder = gpt2(seq=1, past=1, position_input=True, open_past=True, **shape)
    t = time.perf_counter()
    gen = Generator(decoder, hw, context=context, prefill=prefill)
    row: dict[str, Any] = {"hw": hw, "layers": layers, "context": context, "prompt": prompt_len, "new": new,
                           "build_first_s": time.perf_counter() - t,
                           "prefill_mode": gen.prefill_mode, "prefill_why": gen.prefill_why}
    compiled = gen.kernels_compiled
    sess_prefill, sess_decoder = ort_session(prefill), ort_session(decoder)
    rng = np.random.default_rng(0)
    ours: dict[str, list[float]] = {"prompt": [], "step": []}
    theirs: dict[str, list[float]] = {"prompt": [], "step": []}
    agree = True
    for r in range(rounds):
        prompt = [int(x) for x in rng.integers(0, VOCAB, prompt_len)]

        def roller_run(prompt: list[int] = prompt) -> list[int]:
            out = gen.generate(prompt, new)
            ours["prompt"].append(out.prompt_s)
            ours["step"].append(statistics.median(out.step_s))
            return out.tokens

        def ort_run(prompt: list[int] = prompt) -> list[int]:
            tokens, prompt_s, steps = ort_generate(sess_prefill, sess_decoder, prompt, new)
            theirs["prompt"].append(prompt_s)
            theirs["step"].append(statistics.median(steps))
            return tokens

        jobs = [roller_run, ort_run] if r % 2 == 0 else [ort_run, roller_run]
        results = [job() for job in jobs]
        agree = agree and results[0] == results[1]
    row.update({"tokens_agree": agree, "kernels_compiled_after_build": gen.kernels_compiled - compiled,
                "roller_prompt_ms": statistics.median(ours["prompt"]) * 1e3,
                "ort_prompt_ms": statistics.median(theirs["prompt"]) * 1e3,
                "roller_token_ms": statistics.median(ours["step"]) * 1e3,
                "ort_token_ms": statistics.median(theirs["step"]) * 1e3,
                "roller_rounds_token_ms": [x * 1e3 for x in ours["step"]],
                "ort_rounds_token_ms": [x * 1e3 for x in theirs["step"]]})
    row["token_ratio"] = row["roller_token_ms"] / row["ort_token_ms"]
    row["prompt_ratio"] = row["roller_prompt_ms"] / row["ort_prompt_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    r = measure(args.hw, args.layers, args.context, args.prompt, args.new, args.rounds)
    print(f"CPU: {cpu_name()}")
    print(json.dumps({k: v for k, v in r.items() if "rounds" not in k}, indent=1))
    if args.json:
        table = [{"model": f"GPT-2 small structure, {r['layers']} layers", "context": r["context"],
                  "prompt tokens": r["prompt"], "prefill": r["prefill_mode"], "new tokens": r["new"],
                  "onnxruntime ms/token": f"{r['ort_token_ms']:.1f}", "Roller ms/token": f"{r['roller_token_ms']:.1f}",
                  "Roller / ORT per token": f"{r['token_ratio']:.2f}x",
                  "prompt ms ORT / Roller": f"{r['ort_prompt_ms']:.0f} / {r['roller_prompt_ms']:.0f}",
                  "build first s": f"{r['build_first_s']:.0f}",
                  "compiles after build": r["kernels_compiled_after_build"], "same tokens": r["tokens_agree"]}]
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": cpu_name(), "description": args.hw,
               "command": f"python bench/generation.py --layers {args.layers} --context {args.context} "
                          f"--prompt {args.prompt} --new {args.new} --json FILE",
               "target": f"{args.hw} (PoCL on this CPU) against onnxruntime with 2 intra-op threads, same process",
               "rows": table, "measurements": [r]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
