"""The storage layout of constant inputs, chosen by construction (the paper's tile layout, issue 23).

A CPU kernel vectorises a thread's register tile along the last spatial axis. A convolution's output width is
a poor vector axis at model shapes (7 or 14 wide, or read with stride 2: 0.1-0.3x onnxruntime on PoCL), while
its output channels are a good one, if the weights hold them innermost: then every lane reads the next
weight with one vector load and the activation is one broadcast. Weights are constants, so that layout costs
a transpose once, when the model is built. The same holds for a Gemm whose weight is stored transposed.

Construction builds the op as written and each packed variant, and keeps the one the model predicts fastest.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from roller.hw import HardwareDesc
from roller.ir.expr import Read
from roller.ir.tensor_expr import TensorExpr

# A packed variant must be predicted at least this much faster: the transposed copy of the weights costs
# memory and build time, so a tie keeps the layout the user gave.
MIN_GAIN = 0.9
# An axis shorter than this makes no vector worth a layout (a batch of 1).
MIN_LANES = 4


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """``expr`` reads ``tensor`` stored as ``numpy.transpose(weights, perm)``, with ``axis`` as its last
    spatial axis (the CPU kernels' vector axis)."""
    expr: TensorExpr
    tensor: str
    perm: tuple[int, ...]
    axis: str


def packed_variants(expr: TensorExpr, constants: Iterable[str]) -> list[PackedLayout]:
    """Each way to make a constant input's dimension the innermost one and vectorise along the spatial axis
    that indexes it. Applies where that axis indexes the constant plainly (coefficient 1) in one dimension
    and no other input moves with it (those become broadcasts), where the axis is long enough to vectorise,
    and where the result differs from ``expr``."""
    spatial = [a.name for a in expr.spatial_axes]
    if not spatial or expr.preparation is not None:
        return []
    out = []
    for name in [t.name for t in expr.body_inputs if t.name in set(constants)]:
        t = expr.tensor(name)
        accs = expr.accesses(name)
        if t.view is not None or len(accs) != 1 or len(t.shape) < 2:
            continue
        for d, ix in enumerate(accs[0]):
            axis = ix.plain_axis()
            if axis not in spatial or (axis == spatial[-1] and d == len(t.shape) - 1) or \
                    expr.axis(axis).extent < MIN_LANES:
                continue
            # An epilogue's reads (a bias, a residual) happen once per output point: they may gather.
            if any(axis in expr.axes_of(o.name) for o in expr.body_inputs if o.name != name):
                continue
            out.append(_pack(expr, name, d, axis))
    return out


def _pack(expr: TensorExpr, name: str, dim: int, axis: str) -> PackedLayout:
    t = expr.tensor(name)
    perm = tuple(i for i in range(len(t.shape)) if i != dim) + (dim,)
    packed = dataclasses.replace(t, shape=tuple(t.shape[i] for i in perm))

    def reindex(r: Read) -> Read:
        return Read(r.tensor, tuple(r.index[i] for i in perm), r.pos) if r.tensor == name else r

    spatial = [a for a in expr.axes if not a.reduce and a.name != axis] + [expr.axis(axis)]
    axes = tuple(spatial) + tuple(a for a in expr.axes if a.reduce)
    inputs = tuple(packed if i.name == name else i for i in expr.inputs)
    new = dataclasses.replace(expr.remap_reads(reindex), inputs=inputs, axes=axes)
    return PackedLayout(new, name, perm, axis)


def choose_layout(expr: TensorExpr, hw: HardwareDesc, constants: Iterable[str],
                  matrix: Iterable = ()) -> PackedLayout | None:
    """The packed variant of ``expr`` the micro-performance model predicts fastest, or None to keep the
    layout as given. Only where kernels read global memory through a cache (a CPU: the block's layer is a
    cache), which is where the vector axis decides the speed; GPU descriptions keep their layouts."""
    from roller.construction import construct, levels

    block_level, _ = levels(hw)
    if hw.memory[block_level + 1].scope != "cache":
        return None
    variants = packed_variants(expr, constants)
    if not variants:
        return None
    matrix = tuple(matrix)

    def best(e: TensorExpr) -> float:
        p = construct(e, hw, top_k=1, matrix=matrix)[0]
        return p.prediction.time_s if p.prediction else float("inf")

    base = best(expr)
    timed = [(best(v.expr), i) for i, v in enumerate(variants)]
    t, i = min(timed)
    return variants[i] if t < MIN_GAIN * base else None
