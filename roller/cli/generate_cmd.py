"""``roller generate``: greedy decoding with a KV cache on this machine's device (``roller.compiler.generation``).

The decoder (an ONNX model exported with its cache: ``input_ids``, ``attention_mask``, ``position_ids`` and
``past_*`` in, ``logits`` and ``present_*`` out) is built once for ``--context`` positions; the prompt runs token
by token through it, or at once through ``--prefill`` (the model without a cache, its length open). Stdout: the
new token ids on one line; then how long the build, the prompt and each token took.
"""
from __future__ import annotations

import argparse
from typing import Any

from roller.cli.common import add_hw_arguments, positive_int, target_from_args


def token_list(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids separated by commas, got {text!r}") from None
    if not tokens or any(not -(1 << 63) <= t < (1 << 63) for t in tokens):
        raise argparse.ArgumentTypeError(f"expected int64 token ids separated by commas, got {text!r}")
    return tokens


def register(sub: Any) -> None:
    p = sub.add_parser(
        "generate", help="greedy decoding with a KV cache, one build for every prompt and step",
        description="Build a decoder exported with its KV cache once for --context positions and generate "
                    "tokens greedily from --prompt (token ids). Nothing compiles after the build, whatever the "
                    "prompt's length.")
    p.add_argument("file", metavar="DECODER.onnx", help="the decoder with past_* inputs and present_* outputs")
    add_hw_arguments(p)
    p.add_argument("--backend", default=None, metavar="NAME", help="backend (default: the description's)")
    p.add_argument("--prompt", type=token_list, required=True, metavar="IDS", help="token ids, e.g. 464,3290,318")
    p.add_argument("--max-new-tokens", type=positive_int, default=20, metavar="N", help="default: 20")
    p.add_argument("--context", type=positive_int, required=True, metavar="N",
                   help="positions the cache holds: prompt and new tokens together")
    p.add_argument("--prefill", default=None, metavar="MODEL.onnx",
                   help="the model without a cache (its length open) to run the prompt at once")
    p.add_argument("--eos", type=int, default=None, metavar="ID", help="stop after this token")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from roller.compiler.generation import Generator

    target = target_from_args(args)
    gen = Generator(args.file, target, context=args.context, prefill=args.prefill, progress=False)
    out = gen.generate(args.prompt, args.max_new_tokens, eos=args.eos)
    print(" ".join(str(t) for t in out.tokens))
    steps = f"; {len(out.step_s)} more at {out.tokens_per_s:.1f} tokens/s" if out.step_s else ""
    print(f"built in {gen.build_s:.1f} s ({gen.kernels_compiled} kernels); prompt of {len(args.prompt)} tokens "
          f"in {out.prompt_s * 1e3:.1f} ms{steps}")
    if gen.prefill_why:
        print(f"the prefill is built at {args.context - 1} tokens, a prompt padded to them: {gen.prefill_why}")
    return 0
