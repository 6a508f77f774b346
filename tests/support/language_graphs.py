"""Small language models built with ``onnx.helper`` the way ``torch.onnx.export`` writes Hugging Face's (opset 17):
token ids, token types and an int64 attention mask as inputs, embeddings gathered by those ids, the mask turned
into an additive bias (Cast, Sub, Mul: BERT's ``get_extended_attention_mask``), GPT-2's causal mask selected with
Where from a bool buffer, and a KV cache carried in and out. Random weights, a few layers' worth of shapes."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64
#: torch.finfo(torch.float32).min: what Hugging Face fills masked scores with
FINFO_MIN = float(np.finfo(np.float32).min)


class _Builder:
    def __init__(self, seed: int, open_seq: bool = False) -> None:
        # With an open sequence length, shapes are read at run time as the exports do (Shape, Slice; Reshape's 0
        # copies a dimension), never written as constants.
        self.open_seq = open_seq
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        """Random normal weights; a matrix's scaled by 1/sqrt(its rows), so that activations keep their size
        through any number of layers at any width (as a trained model's do)."""
        if scale is None:
            scale = 1 / math.sqrt(shape[0]) if len(shape) > 1 else 0.2
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], out: str = "", **attrs: object) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.weight(cin, cout)]), self.weight(cout, scale=0.05)])

    def layer_norm(self, x: str, hidden: int) -> str:
        return self.op("LayerNormalization", [x, self.const(np.ones(hidden, np.float32)),
                                              self.const(np.zeros(hidden, np.float32))], axis=-1, epsilon=1e-12)

    def heads(self, x: str, seq: int, heads: int, size: int, perm: list[int]) -> str:
        split = self.op("Reshape", [x, self.const(np.array([1, 0 if self.open_seq else seq, heads, size], np.int64))])
        return self.op("Transpose", [split], perm=perm)

    def merge(self, ctx: str, seq: int, hidden: int) -> str:
        """Attention's context [1, heads, seq, size] back to [1, seq, hidden]."""
        rows = self.op("Transpose", [ctx], perm=[0, 2, 1, 3])
        return self.op("Reshape", [rows, self.const(np.array([1, 0 if self.open_seq else seq, hidden], np.int64))])

    def seq_len(self, ids: str) -> str:
        """The sequence length, a 1-element int64 tensor, from the ids' shape."""
        return self.op("Slice", [self.op("Shape", [ids]), self.const(np.array([1], np.int64)),
                                 self.const(np.array([2], np.int64))])

    def positions(self, ids: str, past: int, seq: int) -> str:
        """Position ids [1, seq] after ``past`` cached tokens: a slice of a buffer (Hugging Face registers
        ``position_ids`` as one), cut by the ids' run-time shape when the length is open."""
        if not self.open_seq:
            return self.const(np.arange(past, past + seq, dtype=np.int64).reshape(1, seq), "position_ids")
        end = self.op("Add", [self.seq_len(ids), self.const(np.array([past], np.int64))])
        return self.op("Slice", [self.const(np.arange(1024, dtype=np.int64).reshape(1, 1024), "position_table"),
                                 self.const(np.array([past], np.int64)), end, self.const(np.array([1], np.int64))])

    def gelu(self, x: str) -> str:
        inner = self.op("Erf", [self.op("Div", [x, self.const(np.array(math.sqrt(2), np.float32))])])
        half = self.op("Mul", [x, self.op("Add", [inner, self.const(np.array(1.0, np.float32))])])
        return self.op("Mul", [half, self.const(np.array(0.5, np.float32))])

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[str],
              shapes: dict[str, list[int | str]]) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, F, shapes[o]) for o in outputs]
        graph = helper.make_graph(self.nodes, name, inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(model)
        return model


def _attention(b: _Builder, x: str, bias: str, seq: int, hidden: int, heads: int) -> str:
    """BERT's self-attention as the exports write it."""
    size = hidden // heads
    q = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
    k = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
    v = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Div", [b.op("MatMul", [q, kt]), b.const(np.array(math.sqrt(size), np.float32))])
    probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
    return b.linear(b.merge(b.op("MatMul", [probs, v]), seq, hidden), hidden, hidden)


def bert(vocab: int = 60, hidden: int = 32, heads: int = 4, seq: int = 8, layers: int = 2,
         seed: int = 0, open_seq: bool = False) -> onnx.ModelProto:
    """BERT's encoder: word, position and token-type embeddings, the int64 attention mask as an additive bias,
    ``layers`` post-norm layers with erf GELU; the last hidden state as output. With ``open_seq`` the inputs'
    length is the ``dim_param`` "sequence" (``seq`` is then only the weights' concern: none)."""
    b = _Builder(seed, open_seq)
    ids, types, mask = "input_ids", "token_type_ids", "attention_mask"
    positions = b.positions(ids, 0, seq)
    emb = b.op("Add", [b.op("Add", [b.op("Gather", [b.weight(vocab, hidden), ids]),
                                    b.op("Gather", [b.weight(2, hidden), types])]),
                       b.op("Gather", [b.weight(512, hidden), positions])])
    x = b.layer_norm(emb, hidden)
    m = b.op("Cast", [b.op("Unsqueeze", [mask, b.const(np.array([1, 2], np.int64))])], to=F)
    bias = b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)), m]),
                        b.const(np.array(FINFO_MIN, np.float32))])
    for _ in range(layers):
        att = _attention(b, x, bias, seq, hidden, heads)
        x = b.layer_norm(b.op("Add", [att, x]), hidden)
        ffn = b.linear(b.gelu(b.linear(x, hidden, 4 * hidden)), 4 * hidden, hidden)
        x = b.layer_norm(b.op("Add", [ffn, x]), hidden)
    out = b.op("Identity", [x], "last_hidden_state")
    length: int | str = "sequence" if open_seq else seq
    inputs = [helper.make_tensor_value_info(n, I64, [1, length]) for n in (ids, types, mask)]
    return b.model("bert", inputs, [out], {out: [1, length, hidden]})


def distilbert(vocab: int = 60, hidden: int = 32, heads: int = 4, seq: int = 8, layers: int = 2, seed: int = 3,
               open_seq: bool = False) -> onnx.ModelProto:
    """DistilBERT's encoder as its export writes it: word and position embeddings (no token types), the query
    scaled before its product with the keys, and the padding mask applied with ``masked_fill``: Equal to 0,
    Unsqueeze, Expand to the scores' run-time shape, Where over the float32 minimum."""
    b = _Builder(seed, open_seq)
    size = hidden // heads
    emb = b.op("Add", [b.op("Gather", [b.weight(vocab, hidden), "input_ids"]),
                       b.op("Gather", [b.weight(512, hidden), b.positions("input_ids", 0, seq)])])
    x = b.layer_norm(emb, hidden)
    padded = b.op("Unsqueeze", [b.op("Equal", ["attention_mask", b.const(np.array(0, np.int64))]),
                                b.const(np.array([1, 2], np.int64))])
    for _ in range(layers):
        q = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        q = b.op("Div", [q, b.const(np.array(math.sqrt(size), np.float32))])
        k = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        v = b.heads(b.linear(x, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        mask = b.op("Expand", [padded, b.op("Shape", [scores])])
        scores = b.op("Where", [mask, b.const(np.array(FINFO_MIN, np.float32)), scores])
        att = b.linear(b.merge(b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v]), seq, hidden), hidden, hidden)
        x = b.layer_norm(b.op("Add", [att, x]), hidden)
        ffn = b.linear(b.gelu(b.linear(x, hidden, 4 * hidden)), 4 * hidden, hidden)
        x = b.layer_norm(b.op("Add", [ffn, x]), hidden)
    out = b.op("Identity", [x], "last_hidden_state")
    length: int | str = "sequence" if open_seq else seq
    inputs = [helper.make_tensor_value_info(n, I64, [1, length]) for n in ("input_ids", "attention_mask")]
    return b.model("distilbert", inputs, [out], {out: [1, length, hidden]})


def t5_encoder(vocab: int = 60, hidden: int = 32, heads: int = 4, seq: int = 8, layers: int = 2, buckets: int = 32,
               max_distance: int = 128, seed: int = 4, open_seq: bool = False) -> onnx.ModelProto:
    """T5's encoder as its export writes it: RMS layer norms without a bias, attention without scaling whose
    relative position bias is gathered from a table by buckets computed in int64 from the run-time length (Range,
    Sub, Greater, Abs, Less, Log of the distance, Min, Where: ``_relative_position_bucket``), the padding mask as
    an additive bias, and a ReLU feed-forward."""
    b = _Builder(seed, open_seq)
    size = hidden // heads

    def norm(x: str) -> str:
        var = b.op("ReduceMean", [b.op("Pow", [x, b.const(np.array(2.0, np.float32))])], axes=[-1], keepdims=1)
        scale = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(np.array(1e-6, np.float32))])])])
        return b.op("Mul", [b.weight(hidden, scale=1.0), b.op("Mul", [x, scale])])

    def i64(value: int) -> str:
        return b.const(np.array(value, np.int64))

    length = b.op("Squeeze", [b.seq_len("input_ids")] if open_seq else [b.const(np.array([seq], np.int64))])
    steps = b.op("Range", [i64(0), length, i64(1)])
    relative = b.op("Sub", [b.op("Unsqueeze", [steps, b.const(np.array([0], np.int64))]),
                            b.op("Unsqueeze", [steps, b.const(np.array([1], np.int64))])])   # memory - context
    half = buckets // 2
    exact = half // 2
    ahead = b.op("Mul", [b.op("Cast", [b.op("Greater", [relative, i64(0)])], to=I64), i64(half)])
    distance = b.op("Abs", [relative])
    far = b.op("Div", [b.op("Log", [b.op("Div", [b.op("Cast", [distance], to=F),
                                                 b.const(np.array(exact, np.float32))])]),
                       b.const(np.array(math.log(max_distance / exact), np.float32))])
    far = b.op("Add", [i64(exact), b.op("Cast", [b.op("Mul", [far, b.const(np.array(half - exact, np.float32))])],
                                       to=I64)])
    far = b.op("Min", [far, i64(half - 1)])
    bucket = b.op("Add", [ahead, b.op("Where", [b.op("Less", [distance, i64(exact)]), distance, far])])
    bias = b.op("Unsqueeze", [b.op("Transpose", [b.op("Gather", [b.weight(buckets, heads, scale=1.0), bucket])],
                                   perm=[2, 0, 1]), b.const(np.array([0], np.int64))])
    keep = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2], np.int64))])], to=F)
    bias = b.op("Add", [bias, b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)), keep]),
                                           b.const(np.array(FINFO_MIN, np.float32))])])
    x = b.op("Gather", [b.weight(vocab, hidden, scale=1.0), "input_ids"])
    for _ in range(layers):
        h = norm(x)
        q, k, v = (b.heads(b.op("MatMul", [h, b.weight(hidden, hidden)]), seq, heads, size, [0, 2, 1, 3])
                   for _ in range(3))
        scores = b.op("Add", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), bias])
        ctx = b.merge(b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v]), seq, hidden)
        x = b.op("Add", [x, b.op("MatMul", [ctx, b.weight(hidden, hidden)])])
        ffn = b.op("MatMul", [b.op("Relu", [b.op("MatMul", [norm(x), b.weight(hidden, 4 * hidden)])]),
                              b.weight(4 * hidden, hidden)])
        x = b.op("Add", [x, ffn])
    out = b.op("Identity", [norm(x)], "last_hidden_state")
    width: int | str = "sequence" if open_seq else seq
    inputs = [helper.make_tensor_value_info(n, I64, [1, width]) for n in ("input_ids", "attention_mask")]
    return b.model("t5_encoder", inputs, [out], {out: [1, width, hidden]})


def gpt2(vocab: int = 60, hidden: int = 32, heads: int = 4, seq: int = 4, past: int = 6, layers: int = 1,
         seed: int = 1, open_seq: bool = False, position_input: bool = False, positions: int = 1024,
         open_past: bool = False) -> onnx.ModelProto:
    """GPT-2 blocks with a KV cache: token and position embeddings (positions after the past), the causal mask
    selected with Where from the model's bool buffer, the int64 attention mask over past and new tokens,
    pre-norm attention and MLP (tanh GELU as GPT-2 writes it), tied output embeddings. Inputs ``input_ids``,
    ``attention_mask`` and, with a past, ``past_key``/``past_value`` per layer; outputs the logits and the
    present key and value per layer (suffixed ``.{layer}`` where there are several layers). With ``open_seq``
    (and no past) the length is the ``dim_param`` "sequence" and the causal mask is cut from the buffer by the
    ids' run-time shape, as GPT-2 does; ``position_input`` takes ``position_ids`` as an input, as Optimum
    exports GPT-2 with past key values. ``positions``: the position embeddings' and causal buffer's length.
    ``open_past`` (with ``position_input``) leaves the cache's length open (``past_sequence``; the mask's and
    the present's ``total_sequence``), the causal rows cut by the past's run-time shape: the cache onnxruntime
    grows by one position a step."""
    if open_seq and past:
        raise ValueError("an open sequence length is built without a past")
    if open_past and not (past and position_input):
        raise ValueError("an open past needs a past and position_ids as an input")
    b = _Builder(seed, open_seq)
    size, total = hidden // heads, past + seq
    wte = b.weight(vocab, hidden)
    positions_of = "position_ids" if position_input else b.positions("input_ids", past, seq)
    x = b.op("Add", [b.op("Gather", [wte, "input_ids"]), b.op("Gather", [b.weight(positions, hidden), positions_of])])
    if open_seq:
        length = b.seq_len("input_ids")
        table = b.const(np.tril(np.ones((positions, positions), bool))[None, None], "causal_buffer")
        causal = b.op("Slice", [table, b.const(np.array([0, 0], np.int64)), b.op("Concat", [length, length], axis=0),
                                b.const(np.array([2, 3], np.int64))])
    elif open_past:
        first = "past_key" if layers == 1 else "past_key.0"
        start = b.op("Slice", [b.op("Shape", [first]), b.const(np.array([2], np.int64)),
                               b.const(np.array([3], np.int64))])
        end = b.op("Add", [start, b.const(np.array([seq], np.int64))])
        table = b.const(np.tril(np.ones((positions, positions), bool))[None, None], "causal_buffer")
        causal = b.op("Slice", [table, b.op("Concat", [start, b.const(np.array([0], np.int64))], axis=0),
                                b.op("Concat", [end, end], axis=0), b.const(np.array([2, 3], np.int64))])
    else:
        causal = b.const(np.tril(np.ones((positions, positions), bool))[None, None, past:total, :total], "causal")
    keep = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2], np.int64))])], to=F)
    pad_bias = b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)), keep]),
                            b.const(np.array(FINFO_MIN, np.float32))])
    new: int | str = "sequence" if open_seq else seq
    inputs = [helper.make_tensor_value_info("input_ids", I64, [1, new]),
              helper.make_tensor_value_info("attention_mask", I64, [1, "sequence" if open_seq else
                                                                    "total_sequence" if open_past else total])]
    if position_input:
        inputs.append(helper.make_tensor_value_info("position_ids", I64, [1, new]))
    outputs, shapes = [], {}
    for layer in range(layers):
        tag = "" if layers == 1 else f".{layer}"
        h = b.layer_norm(x, hidden)
        q = b.heads(b.linear(h, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        k = b.heads(b.linear(h, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        v = b.heads(b.linear(h, hidden, hidden), seq, heads, size, [0, 2, 1, 3])
        if past:
            inputs += [helper.make_tensor_value_info(f"past_{kind}{tag}", F,
                                                     [1, heads, "past_sequence" if open_past else past, size])
                       for kind in ("key", "value")]
            k = b.op("Concat", [f"past_key{tag}", k], axis=2)
            v = b.op("Concat", [f"past_value{tag}", v], axis=2)
        scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              b.const(np.array(math.sqrt(size), np.float32))])
        scores = b.op("Where", [causal, scores, b.const(np.array(FINFO_MIN, np.float32))])
        probs = b.op("Softmax", [b.op("Add", [scores, pad_bias])], axis=-1)
        att = b.linear(b.merge(b.op("MatMul", [probs, v]), seq, hidden), hidden, hidden)
        x = b.op("Add", [x, att])
        h = b.linear(b.layer_norm(x, hidden), hidden, 4 * hidden)
        cube = b.op("Mul", [b.op("Mul", [h, h]), h])
        inner = b.op("Mul", [b.op("Add", [h, b.op("Mul", [cube, b.const(np.array(0.044715, np.float32))])]),
                             b.const(np.array(math.sqrt(2 / math.pi), np.float32))])
        gelu = b.op("Mul", [b.op("Mul", [h, b.const(np.array(0.5, np.float32))]),
                            b.op("Add", [b.op("Tanh", [inner]), b.const(np.array(1.0, np.float32))])])
        x = b.op("Add", [x, b.linear(gelu, 4 * hidden, hidden)])
        for kind, value in (("key", k), ("value", v)):
            outputs.append(b.op("Identity", [value], f"present_{kind}{tag}"))
            shapes[outputs[-1]] = [1, heads, "sequence" if open_seq else "total_sequence" if open_past else total,
                                   size]
    logits = b.op("MatMul", [b.layer_norm(x, hidden), b.op("Transpose", [wte], perm=[1, 0])], "logits")
    shapes[logits] = [1, new, vocab]
    return b.model("gpt2", inputs, [logits, *outputs], shapes)


def llama(vocab: int = 60, hidden: int = 32, heads: int = 4, kv_heads: int = 2, seq: int = 4, past: int = 6,
          seed: int = 2, computed_rotary: bool = False) -> onnx.ModelProto:
    """One Llama decoder layer as its export writes it: RMSNorm, rotary position embeddings whose cos and sin
    rows are gathered by the run-time int64 ``position_ids`` (``computed_rotary``: computed from them with Cos
    and Sin, as transformers' export does), grouped-query attention (the key and value heads
    repeated by Unsqueeze, Expand and Reshape) over a KV cache, the causal and padding masks as an additive bias,
    and the SiLU-gated MLP; outputs the logits and the present key and value."""
    b = _Builder(seed)
    size, total, rep = hidden // heads, past + seq, heads // kv_heads

    def rms_norm(x: str) -> str:
        var = b.op("ReduceMean", [b.op("Mul", [x, x])], axes=[-1], keepdims=1)   # opset 17: axes an attribute
        inv = b.op("Div", [b.const(np.array(1.0, np.float32)),
                           b.op("Sqrt", [b.op("Add", [var, b.const(np.array(1e-6, np.float32))])])])
        return b.op("Mul", [b.op("Mul", [x, inv]), b.weight(hidden, scale=1.0)])

    inv_freq = 1.0 / (10000 ** (np.arange(0, size, 2, dtype=np.float32) / size))
    angles = np.outer(np.arange(128, dtype=np.float32), inv_freq)
    table = np.concatenate([angles, angles], axis=-1)
    one_axis = b.const(np.array([1], np.int64))
    if computed_rotary:
        # transformers' LlamaRotaryEmbedding: the angles are the float positions times the inverse frequencies,
        # then Cos and Sin at run time
        freqs = b.op("Mul", [b.op("Unsqueeze", [b.op("Cast", ["position_ids"], to=F),
                                                b.const(np.array([2], np.int64))]), b.const(inv_freq[None, None])])
        angle = b.op("Concat", [freqs, freqs], axis=-1)
        cos = b.op("Unsqueeze", [b.op("Cos", [angle]), one_axis])
        sin = b.op("Unsqueeze", [b.op("Sin", [angle]), one_axis])
    else:
        cos = b.op("Unsqueeze", [b.op("Gather", [b.const(np.cos(table).astype(np.float32)), "position_ids"]),
                                 one_axis])
        sin = b.op("Unsqueeze", [b.op("Gather", [b.const(np.sin(table).astype(np.float32)), "position_ids"]),
                                 one_axis])

    def rotary(x: str) -> str:
        half = size // 2
        lo = b.op("Slice", [x, b.const(np.array([0], np.int64)), b.const(np.array([half], np.int64)),
                            b.const(np.array([-1], np.int64))])
        hi = b.op("Slice", [x, b.const(np.array([half], np.int64)), b.const(np.array([size], np.int64)),
                            b.const(np.array([-1], np.int64))])
        turned = b.op("Concat", [b.op("Neg", [hi]), lo], axis=-1)
        return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [turned, sin])])

    def repeat_kv(x: str) -> str:
        wide = b.op("Expand", [b.op("Unsqueeze", [x, b.const(np.array([2], np.int64))]),
                               b.const(np.array([1, kv_heads, rep, total, size], np.int64))])
        return b.op("Reshape", [wide, b.const(np.array([1, heads, total, size], np.int64))])

    x = b.op("Gather", [b.weight(vocab, hidden), "input_ids"])
    h = rms_norm(x)
    q = rotary(b.heads(b.op("MatMul", [h, b.weight(hidden, hidden)]), seq, heads, size, [0, 2, 1, 3]))
    k = rotary(b.heads(b.op("MatMul", [h, b.weight(hidden, kv_heads * size)]), seq, kv_heads, size, [0, 2, 1, 3]))
    v = b.heads(b.op("MatMul", [h, b.weight(hidden, kv_heads * size)]), seq, kv_heads, size, [0, 2, 1, 3])
    k = b.op("Concat", ["past_key", k], axis=2, out="present_key")
    v = b.op("Concat", ["past_value", v], axis=2, out="present_value")
    causal = np.where(np.tril(np.ones((total, total), bool))[past:], 0.0, FINFO_MIN).astype(np.float32)
    keep = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2], np.int64))])], to=F)
    bias = b.op("Add", [b.const(causal[None, None]), b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)),
                                                                               keep]),
                                                                   b.const(np.array(FINFO_MIN, np.float32))])])
    scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [repeat_kv(k)], perm=[0, 1, 3, 2])]),
                          b.const(np.array(math.sqrt(size), np.float32))])
    probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, repeat_kv(v)])], perm=[0, 2, 1, 3])
    x = b.op("Add", [x, b.op("MatMul", [b.op("Reshape", [ctx, b.const(np.array([1, seq, hidden], np.int64))]),
                                        b.weight(hidden, hidden)])])
    h = rms_norm(x)
    gate = b.op("MatMul", [h, b.weight(hidden, 3 * hidden)])
    up = b.op("MatMul", [h, b.weight(hidden, 3 * hidden)])
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
    x = b.op("Add", [x, b.op("MatMul", [act, b.weight(3 * hidden, hidden)])])
    logits = b.op("MatMul", [rms_norm(x), b.weight(hidden, vocab)], "logits")
    inputs = [helper.make_tensor_value_info("input_ids", I64, [1, seq]),
              helper.make_tensor_value_info("attention_mask", I64, [1, total]),
              helper.make_tensor_value_info("position_ids", I64, [1, seq]),
              helper.make_tensor_value_info("past_key", F, [1, kv_heads, past, size]),
              helper.make_tensor_value_info("past_value", F, [1, kv_heads, past, size])]
    return b.model("llama", inputs, [logits, k, v], {logits: [1, seq, vocab], k: [1, kv_heads, total, size],
                                                     v: [1, kv_heads, total, size]})
