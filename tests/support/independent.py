"""Plain-numpy implementations of the named ops of docs/opjson.md, written from the semantics alone.

Nothing here imports roller: this is the second opinion that tests hold roller.reference and the generated
kernels against. Everything is computed in float64 and returned as float32.

    inputs = make_inputs(op, seed=0)          # {name: float32 array}, names and order per opjson.md
    y = independent_eval(op, inputs)          # float32 array of output_shape(op)

Semantics (docs/opjson.md, "Named ops"):

* matmul: C[M,N] = A @ B; transpose_a means A is stored [K,M], transpose_b means B is stored [N,K].
  batch_matmul likewise per batch, A [B,M,K], B [B,K,N].
* conv2d: cross-correlation. NCHW: X [N,C,H,W], W [F,C,KH,KW] -> Y [N,F,OH,OW];
  NHWC: X [N,H,W,C], W [KH,KW,C,F] -> Y [N,OH,OW,F].
  padding "SAME" (TensorFlow): OH = ceil(H/stride), pad_total = max((OH-1)*stride + (KH-1)*dilation + 1 - H, 0),
  pad_top = pad_total // 2, the rest at the bottom; "VALID": no padding; an int p: p on every side.
* depthwise_conv2d: as conv2d with one filter per channel, W [C,KH,KW]; Y has C channels.
* avgpool2d / maxpool2d: X [N,C,H,W], square window K, stride defaults to K, padding defaults to "VALID";
  average divides by K*K (padded zeros count), max pads with -inf.
* reduce: kind sum|max|min|mean over `axes` of X[shape]; reduced axes removed; mean divides by the product
  of the reduced extents.
* elementwise: `fn` applied with numpy broadcasting to the inputs named in `shapes`, in that order.
* transpose: numpy.transpose(X, perm).
"""
from __future__ import annotations

import math

import numpy as np

UNARY = {
    "relu": lambda x: np.maximum(x, 0.0),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh,
    "cos": np.cos,
    "sin": np.sin,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "abs": np.abs,
    "neg": np.negative,
    "round": np.vectorize(lambda v: float(round(v)), otypes=[np.float64]),   # Python rounds halves to even
}
BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
}
# Functions defined only for positive inputs, and binary functions whose second input must stay away from 0.
_POSITIVE_INPUT = {"log", "sqrt", "rsqrt"}
_NONZERO_SECOND = {"div"}


# ---------------------------------------------------------------------------------------------------------
# Shapes


def conv_out_and_pad(size: int, k: int, stride: int, dilation: int, padding) -> tuple[int, int, int]:
    """(output size, padding before, padding after) of one spatial dimension."""
    span = (k - 1) * dilation + 1
    if padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + span - size, 0)
        return out, total // 2, total - total // 2
    if padding == "VALID":
        before = after = 0
    elif isinstance(padding, int) and not isinstance(padding, bool):
        before = after = padding
    else:
        raise ValueError(f"padding must be 'SAME', 'VALID' or an int, got {padding!r}")
    out = (size + before + after - span) // stride + 1
    if out < 1:
        raise ValueError(f"window {span} does not fit in {size} with padding {padding!r}")
    return out, before, after


def _conv_params(op: dict) -> dict:
    kind = op["op"]
    if kind in ("avgpool2d", "maxpool2d"):
        kh = kw = op["K"]
        stride = op.get("stride", op["K"])
        padding = op.get("padding", "VALID")
        dilation = 1
    else:
        kh, kw = op["KH"], op["KW"]
        stride = op.get("stride", 1)
        padding = op.get("padding", "SAME")
        dilation = op.get("dilation", 1)
    oh, pt, pb = conv_out_and_pad(op["H"], kh, stride, dilation, padding)
    ow, pl, pr = conv_out_and_pad(op["W"], kw, stride, dilation, padding)
    return {"KH": kh, "KW": kw, "stride": stride, "dilation": dilation, "OH": oh, "OW": ow,
            "pads": ((pt, pb), (pl, pr)), "layout": op.get("layout", "NCHW")}


def _nchw(op: dict, n: int, c: int, h: int, w: int) -> list[int]:
    return [n, h, w, c] if op.get("layout", "NCHW") == "NHWC" else [n, c, h, w]


def input_shapes(op: dict) -> dict[str, list[int]]:
    """Input names and shapes, in the order of design.md."""
    kind = op.get("op")
    if kind == "matmul":
        m, n, k = op["M"], op["N"], op["K"]
        return {"A": [k, m] if op.get("transpose_a") else [m, k], "B": [n, k] if op.get("transpose_b") else [k, n]}
    if kind == "batch_matmul":
        b, m, n, k = op["B"], op["M"], op["N"], op["K"]
        return {"A": [b, k, m] if op.get("transpose_a") else [b, m, k],
                "B": [b, n, k] if op.get("transpose_b") else [b, k, n]}
    if kind == "conv2d":
        wshape = ([op["KH"], op["KW"], op["C"], op["F"]] if op.get("layout", "NCHW") == "NHWC"
                  else [op["F"], op["C"], op["KH"], op["KW"]])
        return {"X": _nchw(op, op["N"], op["C"], op["H"], op["W"]), "W": wshape}
    if kind == "depthwise_conv2d":
        return {"X": _nchw(op, op["N"], op["C"], op["H"], op["W"]), "W": [op["C"], op["KH"], op["KW"]]}
    if kind in ("avgpool2d", "maxpool2d"):
        return {"X": _nchw(op, op["N"], op["C"], op["H"], op["W"])}
    if kind in ("reduce", "transpose"):
        return {"X": list(op["shape"])}
    if kind == "elementwise":
        return {name: list(shape) for name, shape in op["shapes"].items()}
    if "expr" in op:
        lhs = op["expr"].split("[", 1)[0].strip()
        return {name: list(shape) for name, shape in op["shapes"].items() if name != lhs}
    raise ValueError(f"unknown op kind {kind!r}")


def output_shape(op: dict) -> list[int]:
    kind = op.get("op")
    if kind == "matmul":
        return [op["M"], op["N"]]
    if kind == "batch_matmul":
        return [op["B"], op["M"], op["N"]]
    if kind in ("conv2d", "depthwise_conv2d", "avgpool2d", "maxpool2d"):
        p = _conv_params(op)
        channels = op["F"] if kind == "conv2d" else op["C"]
        return _nchw(op, op["N"], channels, p["OH"], p["OW"])
    if kind == "reduce":
        axes = {a % len(op["shape"]) for a in op["axes"]}
        return [d for i, d in enumerate(op["shape"]) if i not in axes]
    if kind == "transpose":
        perm = op.get("perm") or list(reversed(range(len(op["shape"]))))
        return [op["shape"][p] for p in perm]
    if kind == "elementwise":
        return list(np.broadcast_shapes(*[tuple(s) for s in op["shapes"].values()]))
    raise ValueError(f"unknown op kind {kind!r}")


# ---------------------------------------------------------------------------------------------------------
# Inputs


def make_inputs(op: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random normal inputs (float32 unless the op says float16), keyed by the design.md input names.

    log/sqrt/rsqrt get positive inputs (|x| + 0.1) and div a divisor of magnitude >= 0.5.
    """
    rng = np.random.default_rng(seed)
    dtypes = op.get("dtypes", {})
    out = {}
    for i, (name, shape) in enumerate(input_shapes(op).items()):
        x = rng.standard_normal(shape)
        if op.get("op") == "elementwise":
            if op["fn"] in _POSITIVE_INPUT:
                x = np.abs(x) + 0.1
            elif op["fn"] in _NONZERO_SECOND and i == 1:
                x = np.where(x < 0, -1.0, 1.0) * (np.abs(x) + 0.5)
        out[name] = x.astype(dtypes.get(name, op.get("dtype", "float32")))
    return out


# ---------------------------------------------------------------------------------------------------------
# Evaluation


def _window_views(xpad: np.ndarray, p: dict):
    """Yield (kh, kw, view) with view[n, c, oh, ow] = xpad[n, c, oh*s + kh*d, ow*s + kw*d]."""
    s, d, oh, ow = p["stride"], p["dilation"], p["OH"], p["OW"]
    for kh in range(p["KH"]):
        for kw in range(p["KW"]):
            h0, w0 = kh * d, kw * d
            yield kh, kw, xpad[:, :, h0:h0 + (oh - 1) * s + 1:s, w0:w0 + (ow - 1) * s + 1:s]


def _pad(x: np.ndarray, p: dict, value: float) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0)) + p["pads"], mode="constant", constant_values=value)


def _conv2d(op: dict, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = _conv_params(op)
    if p["layout"] == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)  # -> X [N,C,H,W], W [F,C,KH,KW]
    xpad = _pad(x, p, 0.0)
    y = np.zeros((x.shape[0], w.shape[0], p["OH"], p["OW"]))
    for kh, kw, view in _window_views(xpad, p):
        y += np.einsum("nchw,fc->nfhw", view, w[:, :, kh, kw])
    return y.transpose(0, 2, 3, 1) if p["layout"] == "NHWC" else y


def _depthwise(op: dict, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = _conv_params(op)
    if p["layout"] == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    xpad = _pad(x, p, 0.0)
    y = np.zeros((x.shape[0], x.shape[1], p["OH"], p["OW"]))
    for kh, kw, view in _window_views(xpad, p):
        y += view * w[None, :, kh, kw, None, None]
    return y.transpose(0, 2, 3, 1) if p["layout"] == "NHWC" else y


def _pool(op: dict, x: np.ndarray) -> np.ndarray:
    p = _conv_params(op)
    nhwc = p["layout"] == "NHWC"
    if nhwc:
        x = x.transpose(0, 3, 1, 2)
    if op["op"] == "maxpool2d":
        y = np.full((x.shape[0], x.shape[1], p["OH"], p["OW"]), -np.inf)
        for _, _, view in _window_views(_pad(x, p, -np.inf), p):
            y = np.maximum(y, view)
    else:
        y = np.zeros((x.shape[0], x.shape[1], p["OH"], p["OW"]))
        for _, _, view in _window_views(_pad(x, p, 0.0), p):
            y += view
        y /= p["KH"] * p["KW"]
    return y.transpose(0, 2, 3, 1) if nhwc else y


def _reduce(op: dict, x: np.ndarray) -> np.ndarray:
    axes = tuple(sorted({a % x.ndim for a in op["axes"]}))
    kind = op["kind"]
    if kind == "sum":
        return x.sum(axis=axes)
    if kind == "max":
        return x.max(axis=axes)
    if kind == "min":
        return x.min(axis=axes)
    if kind == "mean":
        return x.sum(axis=axes) / math.prod(x.shape[a] for a in axes)
    raise ValueError(f"unknown reduce kind {kind!r}")


def _elementwise(op: dict, args: list[np.ndarray]) -> np.ndarray:
    fn = op["fn"]
    if fn in UNARY:
        if len(args) != 1:
            raise ValueError(f"{fn} takes one input, got {len(args)}")
        return UNARY[fn](args[0])
    if fn in BINARY:
        if len(args) != 2:
            raise ValueError(f"{fn} takes two inputs, got {len(args)}")
        return BINARY[fn](args[0], args[1])
    raise ValueError(f"unknown elementwise fn {fn!r}")


def independent_eval(op: dict, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The output of one named op for `inputs` (keyed by the design.md names), as float32."""
    kind = op.get("op")
    names = list(input_shapes(op))
    missing = [n for n in names if n not in inputs]
    if missing:
        raise ValueError(f"missing inputs {missing} for {kind}")
    args = [np.asarray(inputs[n], dtype=np.float64) for n in names]
    if kind == "matmul":
        a, b = args
        if op.get("transpose_a"):
            a = a.T
        if op.get("transpose_b"):
            b = b.T
        y = a @ b
    elif kind == "batch_matmul":
        a, b = args
        if op.get("transpose_a"):
            a = a.transpose(0, 2, 1)
        if op.get("transpose_b"):
            b = b.transpose(0, 2, 1)
        y = a @ b
    elif kind == "conv2d":
        y = _conv2d(op, *args)
    elif kind == "depthwise_conv2d":
        y = _depthwise(op, *args)
    elif kind in ("avgpool2d", "maxpool2d"):
        y = _pool(op, *args)
    elif kind == "reduce":
        y = _reduce(op, *args)
    elif kind == "elementwise":
        y = _elementwise(op, args)
    elif kind == "transpose":
        y = np.transpose(args[0], op.get("perm"))
    else:
        raise ValueError(f"independent_eval handles named ops only, got {kind!r}")
    y = np.asarray(y)
    expected = output_shape(op)
    if list(y.shape) != expected:
        raise AssertionError(f"{kind}: computed shape {list(y.shape)}, expected {expected}")
    return y.astype(np.float32)
