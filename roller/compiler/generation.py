"""Greedy generation with a KV cache: one build of a decoder for every prompt and every step.

A decoder exported with its cache (Hugging Face's ``past_key_values`` in, ``present`` out, as ``torch.onnx.export``
and Optimum write them) is built once at the context size the user gives: the cache it reads is ``context - 1``
positions long at every step, the positions not filled yet masked out by ``attention_mask`` (0) exactly as a
tokenizer's padding is, and the token's position given by ``position_ids``. That is the static cache of
``transformers`` (``StaticCache``) and onnxruntime-genai's shared past/present buffer: every step runs the same
kernels, whatever the prompt's length or the step, so nothing compiles after the first token. A masked position
gets probability exactly 0 in the softmax (``exp`` of the mask's -3.4e38 underflows), so the tokens are those of
the cache at its true length; the cost is attention over the whole context at every step.

The decoder is given its new key and value rows as outputs (a Slice of each ``present`` output at its last
position), so a step downloads one position per layer, not the whole cache. A prompt runs token by token through
the decoder, or at once through a ``prefill`` model (the same weights without a past, its length open: a
``DynamicModel`` built once over every prompt length) when one is given; where that model would be built per
length, it is built once at the longest prompt and a shorter one padded on the right (``prefill_mode``).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roller.dtypes import dtype as dtype_of
from roller.errors import InputError

#: Hugging Face's cache layout: [batch, heads, positions, head size]
CACHE_AXIS = 2
IDS, MASK, POSITIONS = "input_ids", "attention_mask", "position_ids"


@dataclass
class Generation:
    """What ``Generator.generate`` produced: the new tokens, and where the time went."""

    tokens: list[int]
    prompt_s: float  # the prompt's run (prefill, or its tokens one by one)
    step_s: list[float] = field(default_factory=list)  # each new token after the first
    scores: list[np.ndarray] = field(default_factory=list)  # each new token's logits (``output_scores``)

    @property
    def tokens_per_s(self) -> float:
        return len(self.step_s) / sum(self.step_s) if self.step_s else 0.0


def _present_for(past: str, outputs: Sequence[str]) -> str | None:
    """The output that carries input ``past`` forward: Optimum's ``past_key_values.0.key`` -> ``present.0.key``,
    ``past_key`` -> ``present_key``."""
    for old, new in (("past_key_values", "present"), ("past_", "present_"), ("past", "present")):
        if old in past and past.replace(old, new, 1) in outputs:
            return past.replace(old, new, 1)
    return None


def _dims(value_info: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


@dataclass
class _Roles:
    """Which input and output of a decoder is which."""

    cache: dict[str, str]  # past input -> present output
    logits: str
    shapes: dict[str, list[int]]  # every input's shape at the built context


def _roles(proto: Any, context: int, where: str) -> _Roles:
    import onnx

    inits = {i.name for i in proto.graph.initializer}
    inputs = {i.name: i for i in proto.graph.input if i.name not in inits}
    outputs = [o.name for o in proto.graph.output]
    for name, why in ((IDS, "the tokens"), (MASK, "which cache positions hold tokens"),
                      (POSITIONS, ("each token's position (the cache is read at the context size, so its length "
                                   "is not the position: export with position_ids)"))):
        if name not in inputs:
            raise InputError(f"the decoder has no input {name!r}, which gives {why}", source=where)
    cache: dict[str, str] = {}
    shapes: dict[str, list[int]] = {IDS: [1, 1], POSITIONS: [1, 1], MASK: [1, context]}
    for name, info in inputs.items():
        if name in shapes:
            if info.type.tensor_type.elem_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                raise InputError(f"input {name!r} must be int64 or int32", source=where)
            continue
        present = _present_for(name, outputs)
        dims = _dims(info)
        if present is None or len(dims) != 4:
            raise InputError(f"input {name!r} is neither a token input nor a cache [batch, heads, positions, size] "
                             f"with a matching present output", source=where)
        fixed: list[int] = []
        for i, d in enumerate(dims):
            if i == CACHE_AXIS:
                if isinstance(d, int) and d != context - 1:
                    raise InputError(f"input {name!r} holds {d} cache positions (fixed in the model): the context "
                                     f"is then {d + 1}, not {context}", source=where)
                fixed.append(context - 1)
            elif i == 0:
                fixed.append(1)
            elif isinstance(d, int):
                fixed.append(d)
            else:
                raise InputError(f"input {name!r} leaves dimension {i} ({d}) open; only the batch and the "
                                 "cache's positions may be", source=where)
        shapes[name] = fixed
        cache[name] = present
    if not cache:
        raise InputError("the decoder has no cache inputs (past_key_values...): export it with use_cache",
                         source=where)
    rest = [o for o in outputs if o not in cache.values()]
    logits = "logits" if "logits" in rest else (rest[0] if rest else "")
    if not logits:
        raise InputError("the decoder has no logits output", source=where)
    return _Roles(cache, logits, shapes)


def _new_rows(proto: Any, roles: _Roles) -> Any:
    """The decoder with its logits and each present output's last position as outputs (``<present>.new``)."""
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    consts = {"gen.last": [-1], "gen.end": [np.iinfo(np.int64).max], "gen.axis": [CACHE_AXIS]}
    g.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items())
    keep = [o for o in g.output if o.name == roles.logits]
    declared = {o.name: o for o in g.output}
    for present in roles.cache.values():
        g.node.append(helper.make_node("Slice", [present, *consts], [f"{present}.new"], name=f"{present}.new"))
        dims = _dims(declared[present])
        dims[CACHE_AXIS] = 1
        keep.append(helper.make_tensor_value_info(f"{present}.new", declared[present].type.tensor_type.elem_type,
                                                  [d if d != "?" else None for d in dims]))
    del g.output[:]
    g.output.extend(keep)
    return out


class Generator:
    """A decoder built once for ``context`` positions (prompt and new tokens together); ``generate`` runs greedy
    decoding from a prompt. ``prefill``: the same model without a cache, its length open, to run a prompt at
    once."""

    def __init__(self, decoder: Any, hw: Any = None, backend: str | None = None, *, context: int,
                 prefill: Any = None, **options: Any) -> None:
        import roller
        from roller.compiler.inputs import as_model

        if not isinstance(context, int) or isinstance(context, bool) or not 2 <= context <= 1 << 20:
            raise InputError(f"context must be an integer in [2, {1 << 20}], got {context!r}", field="context")
        given = as_model(decoder)
        where = given.source or "decoder"
        self.context = context
        self._lock = threading.Lock()   # one cache: generations from several threads take turns
        self.roles = _roles(given.proto, context, where)
        t = time.perf_counter()
        self.decoder = roller.compile_model(_new_rows(given.proto, self.roles), hw, backend,
                                            shapes=self.roles.shapes, **options)
        if not hasattr(self.decoder, "graph"):
            raise InputError("the decoder still has open sizes at the context's shapes", source=where)
        self.prefill: Any = None   # a DynamicModel over every prompt length, or a Model at the longest
        self.prefill_why = ""   # why the prefill is built at the longest prompt only (not over every length)
        self._padded_prefill = False
        if prefill is not None:
            from roller.compiler.dynamic_model import open_dims

            source = as_model(prefill).proto
            # A prompt is at most context - 1 tokens: the open length is built for that range, no more.
            ranges = {sym: (1, context - 1) for dims in open_dims(source, None).values() for sym in dims.values()}
            if not ranges:
                raise InputError("the prefill model's length is fixed: export it with the sequence length open "
                                 "(a dim_param)", source=as_model(prefill).source or "prefill")
            self.prefill = roller.compile_model(source, hw, backend, ranges=ranges, **options)
            if self.prefill.mode != "generic":
                # Built per length, a new prompt length would compile: instead one build at the longest prompt,
                # a shorter one padded on the right (a causal model's tokens never see the ones after them;
                # the padding is masked out besides) and its first rows kept.
                self.prefill_why = str(self.prefill.why)
                shapes = {name: [1, context - 1] for name in (IDS, MASK, POSITIONS)
                          if name in self.prefill.input_names}
                self.prefill = roller.compile_model(source, hw, backend, shapes=shapes, **options)
                self._padded_prefill = True
            missing = [p for p in self.roles.cache.values() if p not in self.prefill.output_names]
            if missing or self.roles.logits not in self.prefill.output_names:
                raise InputError(f"the prefill model does not give {(missing or [self.roles.logits])[0]!r}, "
                                 "which the decoder's cache needs", source=as_model(prefill).source or "prefill")
        self._cache: dict[str, np.ndarray] = {}
        # One step on an empty cache, and the longest prompt through the prefill: PoCL finishes compiling a
        # kernel at its first launch, and a prefill model plans its buffers (and uploads its weights) for the
        # longest length it has run; both belong to the build, not to the first prompt.
        self._empty_cache()
        if self.prefill is not None:
            self._prompt([0] * (context - 1))
        self._step(0, 0)
        self.build_s = time.perf_counter() - t

    def _empty_cache(self) -> None:
        values = self.decoder.graph.values
        self._cache = {past: np.zeros(self.roles.shapes[past], dtype_of(values[past].dtype).host)
                       for past in self.roles.cache}

    @property
    def prefill_mode(self) -> str:
        """How a prompt runs: "token by token" (no prefill model), "every length" (one build over every prompt
        length), or "padded" (one build at the longest prompt; ``prefill_why`` says why)."""
        return "token by token" if self.prefill is None else "padded" if self._padded_prefill else "every length"

    @property
    def kernels_compiled(self) -> int:
        """Kernels compiled so far by the decoder and the prefill model: the same after every ``generate``."""
        n = len(self.decoder.by_key)
        if self._padded_prefill:
            n += len(self.prefill.by_key)
        elif self.prefill is not None:
            n += self.prefill.generic.kernels_compiled   # a prefill built per length is built padded instead
        return n

    def _step(self, token: int, position: int) -> np.ndarray:
        """One token through the decoder at ``position`` (the cache holds the ``position`` before it)."""
        mask = np.zeros((1, self.context), np.int64)
        mask[0, :position] = 1
        mask[0, -1] = 1
        feeds: dict[str, np.ndarray] = {IDS: np.array([[token]], np.int64), POSITIONS: np.array([[position]], np.int64),
                                        MASK: mask, **self._cache}
        out = self.decoder.run(self._typed(feeds))
        for past, present in self.roles.cache.items():
            self._cache[past][:, :, position] = out[f"{present}.new"][:, :, 0]
        return np.asarray(out[self.roles.logits][0, -1])

    def _typed(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Token inputs in the type the decoder declares (int32 exports exist)."""
        types = {n: self.decoder.graph.values[n].dtype for n in (IDS, POSITIONS, MASK)}
        return {n: a.astype(types[n]) if n in types else a for n, a in feeds.items()}

    def _prompt(self, prompt: list[int]) -> np.ndarray:
        if self.prefill is None:
            logits = np.empty(0)
            for i, token in enumerate(prompt):
                logits = self._step(token, i)
            return logits
        n = len(prompt)
        width = self.context - 1 if self._padded_prefill else n
        ids, mask = np.zeros((1, width), np.int64), np.zeros((1, width), np.int64)
        ids[0, :n], mask[0, :n] = prompt, 1
        feeds = {IDS: ids, MASK: mask}
        if POSITIONS in self.prefill.input_names:
            feeds[POSITIONS] = np.arange(width, dtype=np.int64)[None]
        out = self.prefill.run(feeds)
        for past, present in self.roles.cache.items():
            self._cache[past][:, :, :n] = out[present][:, :, :n]
        return np.asarray(out[self.roles.logits][0, n - 1])

    def generate(self, prompt: Sequence[int], max_new_tokens: int, eos: int | None = None,
                 output_scores: bool = False) -> Generation:
        """Greedy decoding: the prompt's tokens, then ``max_new_tokens`` tokens each the argmax of the logits
        (fewer when ``eos`` comes; ``output_scores`` keeps those logits). The prompt and the new tokens must fit
        the context built for."""
        try:
            tokens = [int(t) for t in np.asarray(prompt, dtype=np.int64).reshape(-1)]
        except (TypeError, ValueError, OverflowError):
            raise InputError("the prompt must be token ids (integers)", field="prompt") from None
        if not tokens:
            raise InputError("the prompt is empty", field="prompt")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}",
                             field="max_new_tokens")
        if len(tokens) + max_new_tokens > self.context:
            raise InputError(f"a prompt of {len(tokens)} tokens and {max_new_tokens} new ones need a context of "
                             f"{len(tokens) + max_new_tokens}; the generator was built for {self.context}",
                             field="max_new_tokens")
        with self._lock:
            return self._generate(tokens, max_new_tokens, eos, output_scores)

    def _generate(self, tokens: list[int], max_new_tokens: int, eos: int | None, output_scores: bool) -> Generation:
        self._empty_cache()
        t = time.perf_counter()
        logits = self._prompt(tokens)
        out = Generation([int(np.argmax(logits))], time.perf_counter() - t, scores=[logits] if output_scores else [])
        position = len(tokens)
        while len(out.tokens) < max_new_tokens and out.tokens[-1] != eos:
            t = time.perf_counter()
            logits = self._step(out.tokens[-1], position)
            out.tokens.append(int(np.argmax(logits)))
            out.step_s.append(time.perf_counter() - t)
            if output_scores:
                out.scores.append(logits)
            position += 1
        return out
