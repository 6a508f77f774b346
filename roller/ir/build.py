"""From a parsed statement and tensor shapes to a checked TensorExpr.

Every check reports where the problem is: ``Where`` carries the file, the field path and the expression text so
that errors can point a caret at the column.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.ir.expr import Affine, BinOp, Call, Expr, Neg, axis_values, gathers, reads, walk
from roller.ir.identifiers import check_identifier, check_name
from roller.ir.parse import ParseError, Statement, parse_statement
from roller.ir.tensor_expr import DTYPE_BYTES, REDUCE_OPS, Axis, Stage, TensorDecl, TensorExpr
from roller.ir.types import FLOAT_COMPUTE, BodyTypes, TypeProblem, typed_body

MAX_ELEMENTS = 2**31 - 1
# Kernels walk a reduction with a 32-bit counter.
MAX_REDUCTION = 2**31 - 1
# Kernels compute an index in 64-bit integers when it can leave the 32-bit range; a tile may run past an axis's
# end (never by more than the axis's extent again, and never past 4x of it), so every index and every partial sum
# of one must stay inside this bound for axis values up to 4x their extent.
MAX_INDEX = 2**62
FLOAT32_MAX = 3.4028234663852886e38


def short(value: object, limit: int = 60) -> str:
    """``repr`` of a value for an error message, cut to ``limit`` characters so that one line stays one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Where:
    source: str | None = None  # file path, or None for an in-memory op
    field: str = ""  # e.g. "ops[2]"

    def at(self, sub: str) -> Where:
        if not self.field:
            return Where(self.source, sub)
        return Where(self.source, f"{self.field}.{sub}" if not sub.startswith("[") else self.field + sub)

    def error(self, message: str, caret: str | None = None) -> InputError:
        return InputError(message, source=self.source, field=self.field or None, caret=caret)


def caret_at(text: str, pos: int, width: int = 100) -> str:
    pos = max(pos, 0)
    if len(text) > width:  # a window around the column keeps a long statement's caret on one screen line
        start = max(0, min(pos - width // 2, len(text) - width))
        head = "..." if start else ""
        tail = "..." if start + width < len(text) else ""
        text, pos = head + text[start:start + width] + tail, pos - start + len(head)
    return f"  {text}\n  {' ' * pos}^"


def expr_error(where: Where, text: str, pos: int, message: str) -> InputError:
    return where.error(f"{message} (column {pos + 1})", caret_at(text, pos))


def build_expr(name: str, text: str, shapes: dict[str, list[int]] | None, *, dtype: str = "float32",
               dtypes: dict[str, str] | None = None, pad_value: float = 0.0, kind: str = "generic",
               params: dict | None = None, extents: dict[str, int] | None = None,
               where: Where = Where()) -> TensorExpr:
    """Parse and check ``text`` against ``shapes``; ``where`` points errors at the op's ``expr`` field.

    ``text`` may hold a second statement after ``;``: an epilogue applied to each reduced value before it is
    stored (``Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = relu(Y[m,n] + C[n])``), where the output read at its own
    index is that value."""
    if ";" in text:
        parts = text.split(";")
        outputs: list[str | None] = []
        for part in parts:
            try:
                outputs.append(parse_statement(part).output)
            except ParseError:
                outputs.append(None)   # reported where the statement is built
        if len(parts) == 2 and outputs[0] == outputs[1]:
            return _with_epilogue(name, text, len(parts[0]) + 1, parts[1], shapes, dtype=dtype, dtypes=dtypes,
                                  pad_value=pad_value, kind=kind, params=params, extents=extents, where=where)
        return _with_stages(name, text, parts, shapes, dtype=dtype, dtypes=dtypes, pad_value=pad_value, kind=kind,
                            params=params, extents=extents, where=where)
    ew = where.at("expr")
    try:
        stmt = parse_statement(text)
    except ParseError as err:
        raise expr_error(ew, text, err.pos, err.message) from None
    shapes = dict(shapes or {})
    dtypes = dict(dtypes or {})
    _check_names(stmt, text, ew)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise where.at("dtype").error(f"expected one of {', '.join(DTYPE_BYTES)}, got {short(dtype)}")
    for tname, dt in dtypes.items():
        if not isinstance(dt, str) or dt not in DTYPE_BYTES:
            raise where.at(f"dtypes.{tname}").error(f"expected one of {', '.join(DTYPE_BYTES)}, got {short(dt)}")

    # Output indices must be distinct plain axes: each output element is written by one point.
    out_axes: list[str] = []
    for i, idx in enumerate(stmt.out_index):
        ax = idx.plain_axis()
        if ax is None:
            raise expr_error(ew, text, _index_pos(text, stmt.out_pos, i),
                             f"output index {i} of {stmt.output} must be a single axis name, got {idx}")
        if ax in out_axes:
            raise expr_error(ew, text, _index_pos(text, stmt.out_pos, i),
                             f"axis {ax!r} appears twice in the output {stmt.output}")
        out_axes.append(ax)

    for g in gathers(stmt.body):
        if stmt.op != "=":
            raise expr_error(ew, text, g.source.pos, f"a read through a run-time index ({g}) is supported in "
                                                     "elementwise ops ('=') only")
    body_reads = reads(stmt.body)
    in_names: list[str] = []
    for r in body_reads:
        if r.tensor == stmt.output:
            raise expr_error(ew, text, r.pos, f"the output {stmt.output} cannot be read on the right-hand side")
        if r.tensor not in in_names:
            in_names.append(r.tensor)
    all_axes: list[str] = list(out_axes)
    for r in body_reads:
        for idx in r.index:
            for a in idx.axes():
                if a not in all_axes:
                    all_axes.append(a)
    values = axis_values(stmt.body)
    for v in values:
        if v.axis not in all_axes:
            all_axes.append(v.axis)
    red_axes = [a for a in all_axes if a not in out_axes]
    reduce_op = REDUCE_OPS[stmt.op]
    if red_axes and reduce_op is None:
        pos = _axis_pos(stmt.body, red_axes[0])
        raise expr_error(ew, text, pos,
                         f"reduction index {red_axes[0]!r} needs a reducing assignment (+=, max=, min=), not '='")

    # Shapes: every read tensor needs one, with the right rank.
    sw = where.at("shapes")
    for t in in_names:
        if t not in shapes:
            pos = next(r.pos for r in body_reads if r.tensor == t)
            raise expr_error(ew, text, pos, f"tensor {t!r} has no entry in 'shapes'")
    for tname in dtypes:
        if tname != stmt.output and tname not in in_names:
            raise where.at(f"dtypes.{tname}").error(f"tensor {tname!r} does not appear in the expression")
    for t, shp in shapes.items():
        if kind == "generic":
            _check_shape(shp, sw.at(t))
        elif math.prod(shp) > MAX_ELEMENTS:  # a named op's shapes come from its parameters, not a field
            raise where.error(f"tensor {t} {list(shp)} has {math.prod(shp)} elements, more than 2^31-1")
        if t != stmt.output and t not in in_names:
            raise sw.at(t).error(f"tensor {t!r} does not appear in the expression")
    for r in body_reads:
        rank = len(shapes[r.tensor])
        if len(r.index) != rank:
            raise expr_error(ew, text, r.pos,
                             f"{r.tensor} has rank {rank} but is indexed with {len(r.index)} indices")

    # Axis extents come from the dimensions an axis indexes alone; they must agree.
    ext: dict[str, int] = {}
    origin: dict[str, str] = {}
    for r in body_reads:
        for d, idx in enumerate(r.index):
            plain = idx.plain_axis()
            if plain is None:
                continue
            a = plain
            size = shapes[r.tensor][d]
            if a in ext and ext[a] != size:
                raise expr_error(ew, text, r.pos,
                                 f"axis {a!r} has extent {ext[a]} from {origin[a]} but {size} from "
                                 f"{r.tensor} dimension {d}")
            ext.setdefault(a, size)
            origin.setdefault(a, f"{r.tensor} dimension {d}")
    if stmt.output in shapes:
        given = shapes[stmt.output]
        if len(given) != len(out_axes):
            raise sw.at(stmt.output).error(
                f"expected rank {len(out_axes)} (the output is indexed [{','.join(out_axes)}]), got {list(given)}")
        for d, a in enumerate(out_axes):
            if a in ext and ext[a] != given[d]:
                raise sw.at(stmt.output).error(
                    f"dimension {d} (axis {a!r}) is {given[d]} but the expression gives {ext[a]} from {origin[a]}")
            ext.setdefault(a, given[d])
    for a, n in (extents or {}).items():
        if a not in all_axes:
            raise where.at(f"extents.{a}").error(f"axis {a!r} does not appear in the expression")
        if a in ext and ext[a] != n:
            raise where.at(f"extents.{a}").error(f"axis {a!r} has extent {ext[a]} from {origin[a]}, got {n}")
        ext[a] = n
    for a in all_axes:
        if a not in ext:
            pos = _axis_pos(stmt.body, a)
            raise expr_error(ew, text, pos, f"cannot infer the extent of axis {a!r}: it never indexes a "
                             "dimension alone (give it in 'extents')")
    oshape: tuple[int, ...] = tuple(shapes.get(stmt.output) or [ext[a] for a in out_axes])
    if math.prod(oshape) > MAX_ELEMENTS:
        raise sw.at(stmt.output).error(f"{stmt.output} has {math.prod(oshape)} elements, more than 2^31-1")
    points = math.prod(ext[a] for a in red_axes)
    if points > MAX_REDUCTION:
        raise where.at("extents" if extents else "expr").error(
            f"the reduction over {', '.join(f'{a}={ext[a]}' for a in red_axes)} has {points} points, more than "
            "2^31-1 (kernels count them in 32 bits)")
    _check_index_range(stmt, ext, text, ew)
    if reduce_op == "sum" and red_axes:
        _check_sum_body(stmt.body, set(red_axes), text, ew, points)

    out = TensorDecl(stmt.output, oshape, dtypes.get(stmt.output, dtype))
    inputs = tuple(TensorDecl(t, tuple(shapes[t]), dtypes.get(t, dtype)) for t in in_names)
    axes = tuple(Axis(a, ext[a], a in red_axes) for a in out_axes + red_axes)
    acc = _acc_dtype(stmt, {t.name: t.dtype for t in inputs}, out.dtype, reduce_op if red_axes else None, text, ew)
    return TensorExpr(name=name, kind=kind, output=out, out_index=tuple(Affine.axis(a) for a in out_axes),
                      inputs=inputs, axes=axes, reduce_op=reduce_op if red_axes else None, body=stmt.body,
                      pad_value=float(pad_value), acc_dtype=acc, params=tuple(sorted((params or {}).items())))


def _acc_dtype(stmt: Statement, tensors: dict[str, str], output: str, reduce_op: str | None, text: str,
               ew: Where) -> str:
    """What the body computes and accumulates in (roller.ir.types): float32 for a float body, float64 where one
    of its tensors is float64; for a typed one its own type, int64 for an integer reduction (whose sum wraps to
    the output's width when stored)."""
    try:
        body_t = BodyTypes(tensors).body(stmt.body, output)
    except TypeProblem as err:
        raise expr_error(ew, text, max(err.pos, 0), err.message) from None
    if not typed_body(stmt.body, tensors) and not dtype_of(output).integral:
        return "float64" if "float64" in (*tensors.values(), output) else "float32"
    if reduce_op is not None:
        if body_t == "bool":
            raise expr_error(ew, text, stmt.op_pos, f"a bool value cannot be reduced with '{stmt.op}' (convert it: "
                             "int64(...))")
        return body_t if body_t in FLOAT_COMPUTE else "int64"
    return body_t


def _with_epilogue(name: str, text: str, offset: int, epi_text: str, shapes: dict[str, list[int]] | None, *,
                   dtype: str, dtypes: dict[str, str] | None, pad_value: float, kind: str, params: dict | None,
                   extents: dict[str, int] | None, where: Where) -> TensorExpr:
    """The op of ``text[:offset - 1]`` with the epilogue statement ``epi_text`` (at column ``offset``)."""
    ew = where.at("expr")
    try:
        stmt = parse_statement(epi_text)
    except ParseError as err:
        raise expr_error(ew, text, err.pos + offset, err.message) from None
    _check_names(stmt, epi_text, ew)
    epi_reads = reads(stmt.body)
    names = list(dict.fromkeys(r.tensor for r in epi_reads if r.tensor != stmt.output))
    try:
        main_reads = {r.tensor for r in reads(parse_statement(text[:offset - 1]).body)}
    except ParseError:
        main_reads = set()   # build_expr reports it
    for t in names:
        if t in main_reads:
            pos = next(r.pos for r in epi_reads if r.tensor == t) + offset
            raise expr_error(ew, text, pos, f"{t} is read by both statements; an epilogue's inputs are its own")
    shapes, dtypes = dict(shapes or {}), dict(dtypes or {})
    main = build_expr(name, text[:offset - 1], {k: v for k, v in shapes.items() if k not in names}, dtype=dtype,
                      dtypes={k: v for k, v in dtypes.items() if k not in names}, pad_value=pad_value, kind=kind,
                      params=params, extents=extents, where=where)
    out = main.output.name
    if stmt.output != out or stmt.op != "=" or stmt.out_index != main.out_index:
        raise expr_error(ew, text, stmt.out_pos + offset, f"an epilogue is '{main.statement().split(' ')[0]} = "
                         "...' (the first statement's output, its index, and '=')")
    for v in axis_values(stmt.body):
        raise expr_error(ew, text, v.pos + offset, f"{v.axis!r}: an epilogue reads tensors, not axis values")
    ext = main.extents
    spatial = {a.name for a in main.spatial_axes}
    decls = []
    for t in names:
        pos = next(r.pos for r in epi_reads if r.tensor == t) + offset
        if t not in shapes:
            raise expr_error(ew, text, pos, f"tensor {t!r} has no entry in 'shapes'")
        _check_shape(shapes[t], where.at("shapes").at(t))
        dt = dtypes.get(t, dtype)
        if not isinstance(dt, str) or dt not in DTYPE_BYTES:
            raise where.at(f"dtypes.{t}").error(f"expected one of {', '.join(DTYPE_BYTES)}, got {short(dt)}")
        decls.append(TensorDecl(t, tuple(shapes[t]), dt))
    for r in epi_reads:
        if r.tensor == out:
            if r.index != main.out_index:
                raise expr_error(ew, text, r.pos + offset, f"the epilogue reads {out} at its own index only")
            continue
        shape = shapes[r.tensor]
        if len(r.index) != len(shape):
            raise expr_error(ew, text, r.pos + offset,
                             f"{r.tensor} has rank {len(shape)} but is indexed with {len(r.index)} indices")
        for d, idx in enumerate(r.index):
            # The epilogue runs once per stored point, without bounds tests: every read must be inside.
            if any(a not in spatial for a in idx.axes()):
                raise expr_error(ew, text, r.pos + offset, f"index {idx} of {r.tensor}: an epilogue indexes "
                                 f"with the output's axes ({', '.join(sorted(spatial))}) only")
            lo, hi = idx.span(ext)
            if lo < 0 or hi >= shape[d]:
                raise expr_error(ew, text, r.pos + offset, f"index {idx} of {r.tensor} reaches {lo}..{hi}, "
                                 f"outside dimension {d} of size {shape[d]}")
    out_expr = replace(main, inputs=main.inputs + tuple(decls), epilogue=stmt.body)
    if out_expr.typed:
        raise ew.error("an op with an epilogue computes in float: integer and bool element types and the typed "
                       "functions are not supported with an epilogue")
    return out_expr


def _with_stages(name: str, text: str, parts: list[str], shapes: dict[str, list[int]] | None, *, dtype: str,
                 dtypes: dict[str, str] | None, pad_value: float, kind: str, params: dict | None,
                 extents: dict[str, int] | None, where: Where) -> TensorExpr:
    """A row kernel: statements ``S1[rows] op= ...; ...; Y[rows, cols] = ...`` where each but the last reduces
    over the last one's other axes (``cols``), and later statements read earlier ones at ``rows``."""
    ew = where.at("expr")
    shapes, dtypes = dict(shapes or {}), dict(dtypes or {})
    offsets = [sum(len(p) + 1 for p in parts[:i]) for i in range(len(parts))]
    stmts = []
    for part, off in zip(parts, offsets):
        try:
            stmts.append(parse_statement(part))
        except ParseError as err:
            raise expr_error(ew, text, err.pos + off, err.message) from None
    *stage_stmts, last = stmts
    names = [st.output for st in stage_stmts]
    mentioned = {r.tensor for st in stmts for r in reads(st.body)} | {last.output}
    for field_name, given in (("shapes", shapes), ("dtypes", dtypes)):
        for t in given:
            if t not in mentioned:
                raise where.at(f"{field_name}.{t}").error(f"tensor {t!r} does not appear in the expression")
    stage_shapes: dict[str, list[int]] = {}
    built = []
    for st, part, off in zip(stage_stmts, parts, offsets):
        if st.op == "=" or names.count(st.output) > 1 or st.output in shapes or st.output == last.output:
            raise expr_error(ew, text, st.out_pos + off, f"{st.output}: each statement before the last computes a "
                             "per-row value of its own with +=, max= or min= (a name not in 'shapes')")
        used = {r.tensor for r in reads(st.body)}
        op = build_expr(name, part, {k: v for k, v in {**shapes, **stage_shapes}.items() if k in used},
                        dtype=dtype, dtypes={k: v for k, v in dtypes.items() if k in used}, pad_value=pad_value,
                        kind=kind, extents=extents, where=where)
        stage_shapes[st.output] = list(op.output.shape)
        built.append(op)
    used = {r.tensor for r in reads(last.body)}
    main = build_expr(name, parts[-1], {k: v for k, v in {**shapes, **stage_shapes}.items() if k in used or
                                        k == last.output}, dtype=dtype,
                      dtypes={k: v for k, v in dtypes.items() if k in used or k == last.output}, pad_value=pad_value,
                      kind=kind, params=params, extents=extents, where=where)
    off = offsets[-1]
    if main.reduce_axes:
        raise expr_error(ew, text, last.op_pos + off, "the last statement of a row kernel is elementwise ('=')")
    index = stage_stmts[0].out_index
    rows = {i.plain_axis() for i in index}
    cols = {a.name: a.extent for a in main.axes if a.name not in rows}
    for st, op, soff in zip(stage_stmts, built, offsets):
        if st.out_index != index or {a.name: a.extent for a in op.reduce_axes} != cols or \
                any(main.axis(str(a)).extent != op.axis(str(a)).extent for a in rows if a in main.extents):
            raise expr_error(ew, text, st.out_pos + soff, f"{st.output} must be indexed [{','.join(map(str, index))}] "
                             f"and reduce over the last statement's other axes ({', '.join(cols) or 'none'})")
    for st, soff in list(zip(stage_stmts, offsets)) + [(last, off)]:
        for r in reads(st.body):
            if r.tensor in names and r.index != index:
                raise expr_error(ew, text, r.pos + soff, f"{r.tensor} is read at its own index "
                                 f"[{','.join(map(str, index))}] only")
    unknown = [t for t in names if t not in {r.tensor for st in stmts[1:] for r in reads(st.body)}]
    if unknown:
        raise where.at("expr").error(f"{unknown[0]} is computed but never read")
    stages = tuple(Stage(st.output, REDUCE_OPS[st.op] or "sum", index, st.body) for st in stage_stmts)
    inputs = {t.name: t for op in built for t in op.inputs if t.name not in names}
    inputs.update({t.name: t for t in main.inputs if t.name not in names})
    # Row axes lead (construction tiles them; each thread walks the rest): the output keeps its own order.
    axes = tuple(a for a in main.axes if a.name in rows) + tuple(a for a in main.axes if a.name not in rows)
    if any(op.acc_dtype not in FLOAT_COMPUTE for op in (*built, main)):
        raise ew.error("a row kernel computes in float: integer and bool element types and the typed functions "
                       "are not supported in one")
    # one accumulator type for every stage: float64 where any stage holds a float64 tensor
    acc = max((op.acc_dtype for op in (*built, main)), key=FLOAT_COMPUTE.index)
    return replace(main, inputs=tuple(inputs.values()), stages=stages, axes=axes, acc_dtype=acc)


def _check_index_range(stmt: Statement, ext: dict[str, int], text: str, where: Where) -> None:
    """Reject an index that 64-bit arithmetic cannot hold: its constant, a coefficient, or any partial sum over
    axis values up to 4x their extents (a tile may run past an axis's end) reaching 2^62 in magnitude."""
    for r in reads(stmt.body):
        for idx in r.index:
            reach = abs(idx.const)
            for a, c in idx.terms:
                reach += abs(c) * max(4 * ext[a], 1)
            if reach >= MAX_INDEX or any(abs(c) >= MAX_INDEX for _, c in idx.terms):
                raise expr_error(where, text, r.pos,
                                 f"index {short(str(idx), 40)} of {r.tensor} can reach about {float(reach):.3g}, "
                                 "beyond the 64-bit integers generated kernels compute indices in")


def _terms(e: Expr) -> list[Expr]:
    """The terms of a body's top-level sum (signs dropped)."""
    out: list[Expr] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, BinOp) and x.op in "+-":
            stack += [x.rhs, x.lhs]
        elif isinstance(x, Neg):
            stack.append(x.x)
        else:
            out.append(x)
    return out


def _depends(e: Expr, axes: set[str]) -> bool:
    return any(a in axes for r in reads(e) for i in r.index for a in i.axes()) or \
        any(v.axis in axes for v in axis_values(e))


def _axis_pos(e: Expr, axis: str) -> int:
    """Column of the first use of ``axis`` in a body: in a read's index, or as a value."""
    cols = [r.pos for r in reads(e) if any(axis in i.axes() for i in r.index)]
    cols += [v.pos for v in axis_values(e) if v.axis == axis]
    return min((c for c in cols if c >= 0), default=0)


def _first_pos(e: Expr, default: int) -> int:
    cols = [r.pos for r in reads(e)] + [v.pos for v in axis_values(e)]
    return min((c for c in cols if c >= 0), default=default)


def _check_sum_body(body: Expr, red: set[str], text: str, where: Where, points: int) -> None:
    """``+=`` sums its body over the reduction axes, point by point. Two bodies read otherwise by most people are
    rejected instead of summed: a term that does not depend on a reduction axis (a bias: it would be added once
    per point) and a function applied to a product of reduction-dependent factors (``relu(A[m,k]*B[k,n])``:
    it would apply to every product, not to their sum)."""
    names = ", ".join(sorted(red))
    for term in _terms(body):
        if not _depends(term, red):
            raise expr_error(where, text, _first_pos(term, 0),
                             f"the term {short(str(term), 40)} does not depend on the reduction axes ({names}): "
                             f"+= would add it once per reduction point ({points} times); sum first, then add it "
                             "in a second op (e.g. Z[m,n] = Y[m,n] + bias[n])")
    for node in walk(body):
        if not isinstance(node, Call):
            continue
        for inner in walk(node):
            if isinstance(inner, BinOp) and inner.op in "*/" and _depends(inner.lhs, red) \
                    and _depends(inner.rhs, red):
                raise expr_error(where, text, _first_pos(node, 0),
                                 f"{node.fn}() wraps a product over the reduction axes ({names}): += applies it "
                                 "to every product, not to their sum; apply it to the result in a second op "
                                 f"(e.g. Z[m,n] = {node.fn}(Y[m,n]))")


def _check_shape(shp: object, where: Where) -> None:
    if not isinstance(shp, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shp):
        raise where.error(f"expected a list of positive integers, got {short(shp)}")
    for i, d in enumerate(shp):
        if d <= 0:
            raise where.at(f"[{i}]").error(f"expected a positive size, got {d}")
    if math.prod(shp) > MAX_ELEMENTS:
        raise where.error(f"{math.prod(shp)} elements is more than 2^31-1 in one tensor")


def _check_names(stmt: Statement, text: str, where: Where) -> None:
    problem = check_name(stmt.output, "tensor")
    if problem:
        raise expr_error(where, text, stmt.out_pos, f"output name: {problem}")
    for r in reads(stmt.body):
        problem = check_name(r.tensor, "tensor")
        if problem:
            raise expr_error(where, text, r.pos, f"tensor name: {problem}")
        for idx in r.index:
            for a in idx.axes():
                problem = check_identifier(a)
                if problem:
                    raise expr_error(where, text, r.pos, f"axis name: {problem}")
    for idx in stmt.out_index:
        for a in idx.axes():
            problem = check_identifier(a)
            if problem:
                raise expr_error(where, text, stmt.out_pos, f"axis name: {problem}")
    for v in axis_values(stmt.body):
        problem = check_identifier(v.axis)
        if problem:
            raise expr_error(where, text, v.pos, f"{v.axis!r} is not an axis, a tensor read or a function call "
                                                 f"({problem})")


def _index_pos(text: str, start: int, i: int) -> int:
    """Column of the i-th index inside ``NAME[...]`` starting at ``start``."""
    p = text.find("[", start) + 1
    depth = 0
    k = 0
    while p < len(text) and k < i:
        c = text[p]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            k += 1
        p += 1
    while p < len(text) and text[p] == " ":
        p += 1
    return p
