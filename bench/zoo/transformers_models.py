"""Language models exported from Hugging Face ``transformers`` as users export them, then run by Roller.

    .venv/bin/pip install torch==2.13.0 transformers     # not part of the project's own dependencies
    .venv/bin/python -m bench.zoo.transformers_models --out DIR [--models bert distilbert t5 gpt2 llama]

Each model is built from its configuration with random weights (``from_config``: nothing is downloaded) and
exported by ``torch.onnx.export`` (TorchScript exporter, opset 17, as bench/zoo/torch_export.py explains), with its
default attention (``sdpa``: the masks arrive as Where, IsNaN, And, Equal and Expand around the scores):

* ``bert`` (BERT-base), ``distilbert`` (DistilBERT-base), ``t5`` (T5-small's encoder): 128 tokens with a padded
  attention mask; run with ``roller.compile_model`` and checked against onnxruntime;
* ``gpt2`` (GPT-2 small) and ``llama`` (a 4-layer Llama: grouped-query attention with 8 query and 2 key/value
  heads, rotary positions computed with Cos and Sin, RMSNorm, SiLU-gated MLP), each twice as Optimum writes a
  causal LM: the decoder with ``past_key_values`` in and ``present`` out (its cache length open) and the model
  without a cache (its length open) for the prompt; run with ``roller.compiler.generation.Generator`` at a
  context of 64 and checked token for token, and logit for logit, against onnxruntime running the whole sequence
  at every step without a cache.

Prints one line per model: what ran, the largest difference, the time against onnxruntime (2 threads), and for
the decoders the tokens per second and the kernels compiled after the build (0).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ENCODERS = ("bert", "distilbert", "t5")
DECODERS = ("gpt2", "llama")
SEQ, PAST, CONTEXT = 128, 7, 64


def _export(module: Any, args: tuple[Any, ...], names: list[str], outputs: list[str], path: Path,
            axes: dict[str, dict[int, str]] | None) -> None:
    import torch

    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs, opset_version=17,
                          dynamo=False, dynamic_axes=axes)


def export_encoder(name: str, out: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "t5":
        model = transformers.T5EncoderModel(transformers.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8))
    else:
        config = transformers.BertConfig() if name == "bert" else transformers.DistilBertConfig()
        model = transformers.AutoModel.from_config(config)
    types = name == "bert"

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: Any, mask: Any, *rest: Any) -> Any:
            kw = {"input_ids": ids, "attention_mask": mask, **({"token_type_ids": rest[0]} if types else {})}
            return self.m(**kw).last_hidden_state

    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[0, 100:] = 0
    args = (torch.randint(0, 1000, (1, SEQ)), mask) + ((torch.zeros(1, SEQ, dtype=torch.long),) if types else ())
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if types else [])
    path = out / f"{name}.onnx"
    _export(Encoder(), args, names, ["last_hidden_state"], path, None)
    return path


def export_decoder(name: str, out: Path) -> tuple[Path, Path]:
    import torch
    import transformers
    from transformers import DynamicCache

    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config)
        layers, kv_heads, size = config.n_layer, config.n_head, config.n_embd // config.n_head
    else:
        config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                          num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                                          max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(config)
        layers, kv_heads, size = 4, 2, 64
    model.eval()

    def flat(cache: Any) -> list[Any]:
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: Any, mask: Any, positions: Any, *past: Any) -> Any:
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            o = self.m(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True)
            return (o.logits, *flat(o.past_key_values))

    class Prefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: Any, mask: Any) -> Any:
            o = self.m(input_ids=ids, attention_mask=mask, use_cache=True)
            return (o.logits, *flat(o.past_key_values))

    past = [torch.randn(1, kv_heads, PAST, size) for _ in range(2 * layers)]
    past_names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outputs = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    decoder, prefill = out / f"{name}-decoder.onnx", out / f"{name}.onnx"
    _export(Decoder(), (torch.randint(0, 1000, (1, 1)), torch.ones(1, PAST + 1, dtype=torch.long),
                        torch.tensor([[PAST]]), *past),
            ["input_ids", "attention_mask", "position_ids", *past_names], outputs, decoder,
            {**{n: {2: "past_sequence"} for n in past_names}, **{n: {2: "total_sequence"} for n in outputs[1:]},
             "attention_mask": {1: "total_sequence"}})
    _export(Prefill(), (torch.randint(0, 1000, (1, 16)), torch.ones(1, 16, dtype=torch.long)),
            ["input_ids", "attention_mask"], outputs, prefill,
            {"input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}, "logits": {1: "sequence"},
             **{n: {2: "sequence"} for n in outputs[1:]}})
    return decoder, prefill


def run_encoder(path: Path, hw: str) -> str:
    import onnx

    import roller
    from bench.layers import ort_session
    from bench.models import alternate

    m = roller.compile_model(path, hw=hw)
    feeds = m.random_inputs(0)
    feeds["attention_mask"][0, 100:] = 0
    report = m.check(feeds)
    sess = ort_session(onnx.load(path))
    ours, theirs = alternate(lambda: m.run(feeds), lambda: sess.run(None, feeds), rounds=4, repeat=3)
    ratio = statistics.median(ours) / statistics.median(theirs)
    return (f"{path.stem}: check {'ok' if report['ok'] else 'FAILED'} (max abs err "
            f"{max(report['max_abs_error'].values()):.1e}), {len(m.kernels)} launches, "
            f"{statistics.median(ours) * 1e3:.0f} ms, {ratio:.2f}x onnxruntime")


def run_decoder(decoder: Path, prefill: Path, hw: str) -> str:
    import onnxruntime as ort

    from roller.compiler.generation import Generator

    gen = Generator(decoder, hw, context=CONTEXT, prefill=prefill)
    built = gen.kernels_compiled
    prompt, n = [464, 3290, 318, 257, 1049, 11, 290, 262], 16
    got = gen.generate(prompt, n, output_scores=True)
    sess = ort.InferenceSession(str(prefill), providers=["CPUExecutionProvider"])
    tokens, err = list(prompt), 0.0
    for i in range(n):
        logits = sess.run(["logits"], {"input_ids": np.array([tokens]),
                                       "attention_mask": np.ones((1, len(tokens)), np.int64)})[0][0, -1]
        err = max(err, float(np.abs(logits - got.scores[i]).max()))
        tokens.append(int(logits.argmax()))
    same = tokens[len(prompt):] == got.tokens
    return (f"{decoder.stem}: {n} tokens {'the same as' if same else 'DIFFERENT from'} onnxruntime without a "
            f"cache (max logit err {err:.1e}), prefill {gen.prefill_mode}, {got.tokens_per_s:.1f} tokens/s, "
            f"built in {gen.build_s:.0f} s, kernels compiled after the build: {gen.kernels_compiled - built}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.zoo.transformers_models", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the .onnx files")
    ap.add_argument("--models", nargs="+", choices=ENCODERS + DECODERS, default=list(ENCODERS + DECODERS))
    ap.add_argument("--hw", default="pocl-cpu")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for name in args.models:
        if name in ENCODERS:
            path = args.out / f"{name}.onnx"
            if not path.exists():
                export_encoder(name, args.out)
            line = run_encoder(path, args.hw)
        else:
            decoder, prefill = args.out / f"{name}-decoder.onnx", args.out / f"{name}.onnx"
            if not (decoder.exists() and prefill.exists()):
                export_decoder(name, args.out)
            line = run_decoder(decoder, prefill, args.hw)
        failed = failed or "FAILED" in line or "DIFFERENT" in line
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
