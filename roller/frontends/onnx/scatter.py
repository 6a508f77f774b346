"""ScatterND and ScatterElements (a KV cache written at run-time positions) as operators that never write
through an index: each output element is its data element combined with the updates whose indices name it,
found by comparing every index with the element's own position (a reduction over the update rows). An index
that names no element (outside its axis after wrapping a negative one once) updates nothing; the cost is the
output's size times the number of update rows, which a cache update of one new position keeps small."""
from __future__ import annotations

from collections.abc import Callable

import onnx

from roller.frontends.onnx.context import Context, translates
from roller.frontends.onnx.elementwise import axes
from roller.frontends.onnx.tensor import _axis
from roller.graph.ir import Value

REDUCTIONS = ("none", "add", "mul", "max", "min")
#: ``mul`` has no reducing assignment in the IR: it applies the update rows one operator each, in order
MUL_ROWS = 64


def _inputs(ctx: Context, node: onnx.NodeProto) -> tuple[Value, Value, Value, str]:
    data, ind, upd = (ctx.device_value(node, i) for i in range(3))
    if ind.dtype not in ("int64", "int32"):
        raise ctx.error(node, f"indices of type {ind.dtype} (int64 or int32 expected)")
    if upd.dtype != data.dtype:
        raise ctx.error(node, f"updates of type {upd.dtype} into data of type {data.dtype}")
    reduction = ctx.text(node, "reduction", "none")
    if reduction not in REDUCTIONS:
        raise ctx.error(node, f"reduction {reduction!r} (one of {', '.join(REDUCTIONS)} expected)")
    return data, ind, upd, reduction


def _wrapped(read: str, size: int) -> str:
    """An index read with a negative value counted from the end once, as ONNX says."""
    return f"where(lt({read}, 0), {read} + {size}, {read})"


def _scatter(ctx: Context, node: onnx.NodeProto, data: Value, inputs: dict[str, str], rows: int,
             hit: Callable[[str], str], update: Callable[[str], str], reduction: str) -> None:
    """The output (data's shape) from ``hit(row)``, a bool saying that update row ``row`` names the element at
    the output's axes ``i0, i1, ...``, and ``update(row)``, that row's value for it; ``row`` is the reduction
    axis ``k`` (extent ``rows``), a constant, or a read of the row found."""
    names = axes(len(data.shape))
    out = f"Y[{','.join(names)}]"
    d = f"D[{','.join(names)}]"
    ins = {"D": data.name, **inputs}
    ext = {"k": rows}
    target = node.output[0]
    if reduction == "add":   # the data element joins the sum once, at row 0
        ctx.kernel(node, f"{out} += where({hit('k')}, {update('k')}, 0) + where(eq(k, 0), {d}, 0)", ins, target,
                   data.shape, extents=ext, dtype=data.dtype)
    elif reduction in ("max", "min"):   # a row that misses gives the data element, which every row joins
        ctx.kernel(node, f"{out} {reduction}= where({hit('k')}, {reduction}({update('k')}, {d}), {d})", ins, target,
                   data.shape, extents=ext, dtype=data.dtype)
    elif reduction == "mul":
        if rows > MUL_ROWS:
            raise ctx.error(node, f"reduction 'mul' over {rows} update rows (at most {MUL_ROWS}: one operator a row)")
        prev = data.name
        for t in range(rows):
            step = target if t == rows - 1 else ctx.fresh(f"{target}:row{t}")
            prev = ctx.kernel(node, f"{out} = where({hit(str(t))}, {d} * {update(str(t))}, {d})",
                              {**inputs, "D": prev}, step, data.shape, dtype=data.dtype)
    else:   # none: the last row naming an element wins (what a loop over the rows gives)
        last = ctx.kernel(node, f"{out} max= where({hit('k')}, k, -1)", {"I": inputs["I"]}, ctx.fresh(f"{target}:row"),
                          data.shape, extents=ext, dtype="int64", kind="arg")
        row = f"R[{','.join(names)}]"
        ctx.kernel(node, f"{out} = where(ge({row}, 0), {update(row)}, {d})", {"D": data.name, "U": inputs["U"], "R": last}, target,
                   data.shape, dtype=data.dtype)


@translates("ScatterElements")
def scatter_elements(ctx: Context, node: onnx.NodeProto) -> None:
    """``Y = D`` with ``Y[j... with I[j...] at the axis] = U[j...]`` for every position of the indices. The
    indices (and updates) must span the data off the axis."""
    data, ind, upd, reduction = _inputs(ctx, node)
    rank = len(data.shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank)
    if list(ind.shape) != list(upd.shape) or len(ind.shape) != rank or \
            any(ind.shape[d] != data.shape[d] for d in range(rank) if d != axis):
        raise ctx.error(node, f"indices {list(ind.shape)} and updates {list(upd.shape)} must have one shape, "
                              f"the data's {list(data.shape)} off axis {axis}")
    names = axes(rank)

    def at(row: str) -> str:
        return ",".join(row if d == axis else names[d] for d in range(rank))
    _scatter(ctx, node, data, {"I": ind.name, "U": upd.name}, ind.shape[axis],
             lambda row: f"eq({_wrapped(f'I[{at(row)}]', data.shape[axis])}, {names[axis]})",
             lambda row: f"U[{at(row)}]", reduction)


@translates("ScatterND")
def scatter_nd(ctx: Context, node: onnx.NodeProto) -> None:
    """``Y = D`` with ``Y[I[r]] = U[r]`` for every row ``r`` of the indices (their last axis holds one
    position's first ``q`` coordinates; the update is the slice of the remaining axes)."""
    data, ind, upd, reduction = _inputs(ctx, node)
    rank = len(data.shape)
    q = int(ind.shape[-1]) if ind.shape else 0
    batch = list(ind.shape[:-1])
    if not 1 <= q <= rank or list(upd.shape) != batch + list(data.shape[q:]):
        raise ctx.error(node, f"indices {list(ind.shape)} and updates {list(upd.shape)} do not fit data "
                              f"{list(data.shape)} (updates: the indices' shape without its last axis, then the "
                              "data's axes the indices leave)")
    rows = 1
    for s in batch:
        rows *= s
    # the update rows on one axis: a view of the indices as [rows, q] and of the updates as [rows, ...]
    ind_rows = ctx.view(node, ind.name, ctx.fresh(ind.name + ":rows"), [rows, q])
    upd_rows = ctx.view(node, upd.name, ctx.fresh(upd.name + ":rows"), [rows, *data.shape[q:]])
    names = axes(rank)

    def hit(row: str) -> str:
        terms = [f"eq({_wrapped(f'I[{row},{c}]', data.shape[c])}, {names[c]})" for c in range(q)]
        text = terms[0]
        for t in terms[1:]:
            text = f"and({text}, {t})"
        return text
    _scatter(ctx, node, data, {"I": ind_rows, "U": upd_rows}, rows, hit,
             lambda row: f"U[{','.join([row, *names[q:]])}]", reduction)
