"""Language-model latency on this machine's OpenCL device against onnxruntime, in the same process (issue 37).

    .venv/bin/python bench/language.py [--models bert_base gpt2_prefill gpt2_decode llama_decode] [--layers 12]
                                       [--rounds 5] [--json OUT]

The models are built with ``onnx.helper`` as ``torch.onnx.export`` writes Hugging Face's
(``tests/support/language_graphs.py``: int64 token ids and attention mask in, embeddings gathered by the ids on
the device), at their real sizes with random weights: BERT-base (12 layers, hidden 768, 12 heads, vocabulary
30,522, 128 tokens with a padded mask), GPT-2 small's block structure (hidden 768, 12 heads, vocabulary 50,257)
as a 128-token prefill and as one decoding step over a 127-token KV cache, and one layer of a Llama-style
decoder (rotary positions gathered by the position ids, 12 query heads sharing 4 key/value heads, SiLU-gated
MLP, vocabulary 32,000) decoding one token over a 127-token cache. ``--layers`` stacks that many BERT or GPT-2
blocks (each with its own KV cache for GPT-2). For each: compile
time (first, with this process's kernel cache as it is, then warm), the outputs checked against onnxruntime,
then latency of Roller's executor (inputs uploaded, outputs downloaded: what a user's ``run`` costs) and of
onnxruntime (all graph optimisations, 2 intra-op threads), alternating, ``--rounds`` rounds of ``--repeat``
runs, medians. A second call with other token ids compiles nothing (one build per model): it is timed too.
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
from bench.models import alternate, compile_twice, cpu_name
from tests.support.language_graphs import bert, gpt2, llama

MODELS = ("bert_base", "gpt2_prefill", "gpt2_decode", "llama_decode")


def build(name: str, layers: int) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    if name == "bert_base":
        model = bert(vocab=30522, hidden=768, heads=12, seq=128, layers=layers)
        mask = np.ones((1, 128), np.int64)
        mask[0, 100:] = 0
        return model, {"input_ids": rng.integers(0, 30522, (1, 128)), "token_type_ids": np.zeros((1, 128), np.int64),
                       "attention_mask": mask}
    if name == "llama_decode":   # one layer of a Llama-style decoder: 12 query heads sharing 4 key/value heads
        model = llama(vocab=32000, hidden=768, heads=12, kv_heads=4, seq=1, past=127)
        return model, {"input_ids": rng.integers(0, 32000, (1, 1)), "attention_mask": np.ones((1, 128), np.int64),
                       "position_ids": np.array([[127]]),
                       "past_key": rng.standard_normal((1, 4, 127, 64)).astype(np.float32),
                       "past_value": rng.standard_normal((1, 4, 127, 64)).astype(np.float32)}
    seq, past = (128, 0) if name == "gpt2_prefill" else (1, 127)
    model = gpt2(vocab=50257, hidden=768, heads=12, seq=seq, past=past, layers=layers)
    feeds = {"input_ids": rng.integers(0, 50257, (1, seq)), "attention_mask": np.ones((1, seq + past), np.int64)}
    for i in model.graph.input:
        if i.name.startswith("past_"):
            feeds[i.name] = rng.standard_normal((1, 12, past, 64)).astype(np.float32)
    return model, feeds


def measure(name: str, hw: str, layers: int, rounds: int, repeat: int) -> dict[str, Any]:
    model, feeds = build(name, layers)
    row: dict[str, Any] = {"model": name, "hw": hw, "layers": 1 if name == "llama_decode" else layers}
    m, row["compile_first_s"], row["compile_warm_s"] = compile_twice(model, hw)
    row["kernels_launched"] = len(m.kernels)
    row["max_abs_error"] = max(m.check(feeds)["max_abs_error"].values())
    other = dict(feeds, input_ids=np.roll(feeds["input_ids"], 1))
    t = time.perf_counter()
    m.run(other)
    row["second_sentence_s"] = time.perf_counter() - t
    sess = ort_session(model)
    for _ in range(2):
        m.run(feeds)
        sess.run(None, feeds)
    ours, theirs = alternate(lambda: m.run(feeds), lambda: sess.run(None, feeds), rounds, repeat)
    row["roller_ms"] = statistics.median(ours) * 1e3
    row["ort_ms"] = statistics.median(theirs) * 1e3
    row["ratio"] = row["roller_ms"] / row["ort_ms"]
    row["roller_rounds_ms"] = [x * 1e3 for x in ours]
    row["ort_rounds_ms"] = [x * 1e3 for x in theirs]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = [measure(n, args.hw, args.layers, args.rounds, args.repeat) for n in args.models]
    print(f"CPU: {cpu_name()}")
    print("| model | layers | compile first s | warm s | kernels | max abs err | roller ms | onnxruntime ms | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['layers']} | {r['compile_first_s']:.1f} | {r['compile_warm_s']:.1f} | "
              f"{r['kernels_launched']} | {r['max_abs_error']:.1e} | {r['roller_ms']:.2f} | {r['ort_ms']:.2f} | "
              f"{r['ratio']:.2f} |")
    if args.json:
        # the rows as bench/report.py shows them (a loose table: formatted cells), every number beside them
        table = [{"model": r["model"], "layers": r["layers"], "onnxruntime ms": f"{r['ort_ms']:.2f}",
                  "Roller ms": f"{r['roller_ms']:.2f}", "Roller / ORT": f"{r['ratio']:.2f}x",
                  "compile first s": f"{r['compile_first_s']:.1f}", "compile warm s": f"{r['compile_warm_s']:.1f}",
                  "kernels launched": r["kernels_launched"], "max abs err": f"{r['max_abs_error']:.1e}"}
                 for r in rows]
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": cpu_name(), "description": args.hw,
               "command": "python bench/language.py --json FILE" + (f" --layers {args.layers}"
                                                                    if args.layers != 12 else ""),
               "target": f"{args.hw} (PoCL on this CPU) against onnxruntime with 2 intra-op threads, same process",
               "rows": table, "measurements": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
