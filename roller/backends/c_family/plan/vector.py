"""The vector path of CPU kernels: reads, a register tile and a reduction walk in ``width``-wide vectors.

Once the schedule (``schedule.py``: ``vectorise``, ``tile_vectors``, ``row_vector_width``) has chosen that a
kernel vectorises, along which axis, how wide and in which versions, this module prints it: each read as a
broadcast, one vector load, a pair of strided loads, a transposed load or gathered lanes (``vector_read``, which
``rows.py`` uses for a row's columns too), the versions' bodies, guards and stores (``vec_plan``), and the
reduction's vector walk (``reduce_vec_plan``). Apart from ``access.py`` because only dialects with vector loads
(OpenCL on CPUs) take this path, and its reads are the larger part of the plan.

GPU dialects have no vector arithmetic, and their vector form is the one of ops with no reuse
(``stream_plan``, RProgram.vector): whole 16-byte structs loaded and stored, the body computed lane by lane.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from roller.backends.c_family.plan.access import (
    axis_maxes,
    element,
    flat_coef,
    global_address,
    global_read,
    index_span,
    is_guarded,
)
from roller.backends.c_family.plan.cexpr import (
    affine_c,
    c_float,
    combine_stmt,
    render_body,
    render_epilogue,
    var_global,
)
from roller.backends.c_family.plan.schedule import VecSchedule
from roller.backends.c_family.plan.types import (
    AxisPlan,
    Dialect,
    ReduceVecPlan,
    StreamPlan,
    TensorPlan,
    VecFlavor,
    VecPlan,
)
from roller.errors import InputError
from roller.ir.expr import Affine, AxisValue, walk
from roller.ir.tensor_expr import TensorExpr


def vec_plan(expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan],
             epilogue_inputs: list[TensorPlan], out: TensorPlan, d: Dialect, vs: VecSchedule) -> VecPlan:
    """The vector form of a CPU kernel's register tile, as ``vs`` (schedule.tile_vectors) has it: a version for
    the runs inside the last spatial axis, and where ``vs`` says so a first one without bounds tests, one that
    skips runs past the axis's end and one for the run across it."""
    ax = spatial[-1]
    width = vs.width
    acc = d.ctype[expr.acc_dtype]
    vtype = f"{acc}{width}"
    partial = {a.name: a.extent for a in spatial if a.extent % a.block}
    across = vs.across

    def body(clamp: dict[str, int], plans: list[TensorPlan] = inputs) -> str:
        reads = {}
        for tp in plans:   # the unstaged plans lower() made, in expr.inputs order
            for idx in expr.accesses(tp.name):
                reads[(tp.name, idx)] = vector_read(tp, idx, ax.name, ax.extent, width, vtype, expr.pad_value, d,
                                                    clamp, across, aligned=not ax.block % width)
        def axis_v(a: str) -> str:
            lanes = f" + ({vtype})({', '.join(f'{k}.0{d.float_suffix}' for k in range(width))})" if a == ax.name else ""
            return f"(({vtype})(({d.real}){var_global(a)}){lanes})"

        return render_body(expr.body, d, lambda r: reads[(r.tensor, r.index)], vtype, axis_v)

    def epilogue(clamp: dict[str, int]) -> str:
        return render_epilogue(expr, d, epilogue_inputs, "rl_vr0", lambda tp, idx: vector_read(
            tp, idx, ax.name, ax.extent, width, vtype, expr.pad_value, d, clamp), vtype)

    def guard(axes: dict[str, int]) -> str:
        return " && ".join(f"rl_g_{a} < {n}" for a, n in axes.items())

    rows = {a: n for a, n in partial.items() if a != ax.name}
    offset = ""
    if vs.contiguous:
        offset = " + ".join(f"({affine_c(i, var_global)}) * {s}" if s != 1 else f"({affine_c(i, var_global)})"
                            for i, s in zip(expr.out_index, out.strides))
    inside = VecFlavor("", body(rows), offset, guard(rows), not offset, guard(rows), epilogue=epilogue(rows))
    flavors = [inside]
    if ax.name in partial:
        start = f"rl_s_{ax.name} + rl_t_{ax.name} * {ax.thread}"
        inside.cond = f"{start} + {ax.thread} <= {ax.extent}"
        if vs.cross is not None:
            if vs.skip:
                flavors.append(VecFlavor(f"{start} >= {ax.extent}", "", "", "", False, "", skip=True))
            # Across the axis's end, the vectors wholly inside are still stored as one.
            whole = " && ".join(filter(None, [guard(rows), f"rl_g_{ax.name} + {width - 1} < {ax.extent}"]))
            flavors.append(VecFlavor("", body(partial), offset, whole, True, guard(partial), run_start=vs.cross,
                                     epilogue=epilogue(partial)))
    bounds = vs.interior
    if bounds:
        # First, the threads whose windows stay inside the tensors read without bounds tests.
        narrowed = [replace(tp, ranges={**tp.ranges, **{a: hi for a, (_, hi) in bounds.items()}},
                            lows={a: lo for a, (lo, _) in bounds.items()}) for tp in inputs]
        runs = {a.name: (f"rl_s_{a.name} + rl_t_{a.name} * {a.thread}", a.thread) for a in spatial}
        tests = [f"{runs[a][0]} >= {lo}" for a, (lo, _) in bounds.items() if lo > 0] + \
                [f"{runs[a][0]} + {runs[a][1] - 1} <= {hi}" for a, (_, hi) in bounds.items()]
        flavors.insert(0, replace(inside, cond=" && ".join(filter(None, [*tests, inside.cond])),
                                  body=body(rows, narrowed)))
    return VecPlan(width, ax.name, vtype, flavors,
                   stream=d.streaming_store.format(v="rl_vr", vtype=vtype, ptr="{ptr}") if vs.stream else "")


def reduce_vec_plan(expr: TensorExpr, spatial: list[AxisPlan], reduce: list[AxisPlan], inputs: list[TensorPlan],
                    d: Dialect, axis: str, width: int) -> ReduceVecPlan:
    """The vector walk along the innermost reduction axis ``axis``, ``width`` wide, where schedule.vectorise
    (roller.ir.vector.reduction_vector) picks it."""
    vtype = f"{d.ctype[expr.acc_dtype]}{width}"
    extent = expr.axis(axis).extent
    loop_extent = {ax.name: ax.extent_c or ax.extent for ax in reduce}
    reads = {(tp.name, idx): vector_read(tp, idx, axis, extent, width, vtype, expr.pad_value, d, {})
             for tp in inputs for idx in expr.accesses(tp.name)}
    body = render_body(expr.body, d, lambda r: reads[(r.tensor, r.index)], vtype,
                       lambda a: f"(({vtype})(({d.real}){var_global(a)}) + ({vtype})"
                                 f"({', '.join(f'{k}.0{d.float_suffix}' for k in range(width))}))" if a == axis
                       else f"(({vtype})(({d.real}){var_global(a)}))")
    outer: list[tuple[str, int | str, int]] = [(a.name, loop_extent[a.name], 0) for a in expr.reduce_axes
                                               if a.name != axis]
    guard = " && ".join(f"{var_global(ax.name)} < {ax.extent}" for ax in spatial if ax.extent % ax.block)
    return ReduceVecPlan(width, vtype, axis, loop_extent[axis], body, combine_stmt(expr.reduce_op, d, True), outer,
                         guard)


def vector_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, axis_extent: int, width: int, vtype: str,
                pad: float, d: Dialect, clamp: dict[str, int], across: dict[str, int] | None = None,
                aligned: bool = False) -> str:
    """``width`` adjacent points of one read along ``axis``: one broadcast element, one vector load, or (a
    view, a stride, a guard that differs from lane to lane, a run across the axis's end) the lanes' scalar
    reads gathered into a vector. Plain indices of the axes in ``clamp`` are clamped into range, as in the
    scalar path. ``aligned``: the runs along ``axis`` start at multiples of ``width``, so that a window's
    vectors across the tensor's edge load whole (_border_vector)."""
    def lane(k: int) -> Callable[[str], str]:
        return lambda a: f"({var_global(a)} + {k})" if a == axis and k else var_global(a)

    if not any(i.coefs.get(axis, 0) for i in idx):
        step: int | None = 0  # the same element for every lane, through a view or not
    else:
        step = flat_coef(idx, tp.strides, axis) if tp.view is None else None
    if step == 0:
        return f"(({vtype})({global_read(tp, idx, var_global, pad, d, clamp)}))"
    def gathered() -> str:
        return f"({vtype})({', '.join(global_read(tp, idx, lane(k), pad, d, clamp) for k in range(width))})"

    if step == 2 and width > 1 and tp.view is None:
        return _stride2_read(tp, idx, axis, axis_extent, width, vtype, d, clamp, lane, gathered)
    if step != 1:
        return (_transposed_read(tp, idx, axis, width, vtype, across, d) if across and step is not None else None) \
            or gathered()
    # In a run that crosses the axis's end (``axis`` in ``clamp``) the vectors wholly inside it still load
    # as one: the address is not clamped along the axis, and a test that the last lane is inside picks the
    # load; the vector across the end gathers its lanes clamped.
    rows = {a: n for a, n in clamp.items() if a != axis}
    # Inside the run (or a run wholly inside the axis) the lanes stay inside the axis's extent.
    inside = {axis: axis_extent}
    conds, offs = global_address(tp, idx, var_global, rows, d, inside)
    load = d.vload(tp.ctype, width, f"{tp.name} + {offs}")
    # A window along the axis (a convolution's w + s - 1) too: its vector across the run's end would read
    # past the row, and from the tensor's last row past the buffer (Oclgrind saw it; a GPU may fault there).
    ends = [f"{var_global(axis)} + {width - 1} < {clamp[axis]}"] if axis in clamp and any(
        i.coefs.get(axis, 0) for i in idx) else []
    # A window that moves with the lanes (a convolution's w + s - 1): the lanes' indices are affine, so the
    # first and last lane inside the tensor means all are, and the run is one load; at a border, gather.
    maxes = axis_maxes(tp, rows, inside)
    moving = any(is_guarded(tp, dim, i, maxes) and i.coefs.get(axis, 0) for dim, i in enumerate(idx))
    if moving:
        ends += global_address(tp, idx, lane(width - 1), rows, d, inside)[0]
        border = None if axis in clamp or not aligned else \
            _border_vector(tp, idx, axis, width, vtype, pad, d, rows, inside, conds)
        if border is not None:
            return f"({' && '.join(dict.fromkeys(conds + ends))} ? {load} : {border(gathered())})"
    if ends:
        return f"({' && '.join(dict.fromkeys(conds + ends))} ? {load} : {gathered()})"
    if conds:
        return f"({' && '.join(conds)} ? {load} : ({vtype})({c_float(pad, d)}))"
    return load


def _border_vector(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, width: int, vtype: str, pad: float,
                   d: Dialect, rows: dict[str, int], inside: dict[str, int],
                   conds: list[str]) -> Callable[[str], str] | None:
    """A window's vector across a tensor's edge (``w + s - 1`` for the run's first or last vector) as one load
    of the vector at the edge and its lanes moved over, the pad value in the lanes outside, instead of its lanes
    gathered one by one: for each number of lanes outside that the window can reach, a test of the first
    lane's index picks the version. The result takes the gathered vector as the last resort (``None`` where this
    does not apply: the lanes move along a dimension that is not contiguous, or along more than one). A 3x3
    average pool's border vectors gathered eight lanes each, one of nine loads for every row's first and last
    vector, and ran at 0.60x of a copy kernel; without them 0.95x (docs/opencl.md)."""
    maxes = axis_maxes(tp, rows, inside)
    guarded = [dim for dim, i in enumerate(idx) if is_guarded(tp, dim, i, maxes)]
    moving = [dim for dim in guarded if idx[dim].coefs.get(axis, 0)]
    if tp.view is not None or len(moving) != 1 or len(conds) != len(guarded):
        return None
    dm = moving[0]
    i = idx[dm]
    size = tp.sizes[dm]
    if i.coefs[axis] != 1 or tp.strides[dm] != 1 or size < width or any(a in rows for a, _ in i.terms) or \
            any(j.coefs.get(axis, 0) for dim, j in enumerate(idx) if dim != dm):
        return None
    # The vector's first lane sits at a multiple of the width (aligned runs), its last inside the axis.
    low, high = index_span(Affine(tuple((a, c) for a, c in i.terms if a != axis), i.const), tp.lows, maxes)
    low += -(-tp.lows.get(axis, 0) // width) * width
    high += (maxes[axis] - width + 1) // width * width
    left, right = min(width - 1, -low), min(width - 1, high + width - size)
    if left <= 0 and right <= 0:
        return None
    q0 = f"({affine_c(i, var_global, d.wide_int)})"
    fill = c_float(pad, d)

    def at(first: int) -> str:
        moved = tuple(Affine((), first) if dim == dm else j for dim, j in enumerate(idx))
        return d.vload(tp.ctype, width, f"{tp.name} + {global_address(tp, moved, var_global, rows, d, inside)[1]}")

    versions = [(f"{q0} == -{k}", f"({vtype})({', '.join([fill] * k + _lanes(at(0), range(width - k)))})")
                for k in range(1, left + 1)]
    versions += [(f"{q0} == {size - width + k}",
                  f"({vtype})({', '.join(_lanes(at(size - width), range(k, width)) + [fill] * k)})")
                 for k in range(1, right + 1)]
    others = [c for dim, c in zip(guarded, conds) if dim != dm]

    # Where the versions cover every first lane the window reaches outside the tensor, the last needs no test
    # and nothing is gathered: the gathered lanes' code, folded away only after unrolling, kept PoCL from
    # unrolling the register tile's loop at all.
    covered = -low < width and high + width - size < width

    def chain(fallback: str) -> str:
        out = versions[-1][1] if covered else fallback
        for test, vec in reversed(versions[:-1] if covered else versions):
            out = f"({test} ? {vec} : {out})"
        return f"({' && '.join(others)} ? {out} : ({vtype})({fill}))" if others else out

    return chain


def _lanes(vector: str, ks: range) -> list[str]:
    """Lanes ``ks`` (consecutive) of an OpenCL vector expression, as component selections of at most four."""
    out, ks_list = [], list(ks)
    for n in range(0, len(ks_list), 4):
        part = ks_list[n:n + 4]
        out.append(f"{vector}.s{''.join(format(k, 'x') for k in part)}")
    return out


def _stride2_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, axis_extent: int, width: int, vtype: str,
                  d: Dialect, clamp: dict[str, int], lane: Callable[[int], Callable[[str], str]],
                  gathered: Callable[[], str]) -> str:
    """A run that moves by two elements per lane (a stride-2 window, ``2w + s``) as two contiguous loads of
    ``width`` and their even and odd lanes: the first load holds lanes 0..width/2-1 at its even positions,
    the second, one element short of the first's end, the rest at its odd ones, so the two span exactly the
    lanes' elements and stay inside the tensor wherever the lanes do. Only where no lane needs a bounds test
    (an input read from its padded copy): with a test per read, PoCL kept both the loads and the gathered
    lanes, and took 75-95 s to compile 7x7 stride-2 convolutions. A depthwise 3x3 stride-2 convolution
    gathered its 16 lanes one by one at 0.16-0.21x onnxruntime."""
    rows = {a: n for a, n in clamp.items() if a != axis}
    inside = {axis: axis_extent}
    conds, offs = global_address(tp, idx, var_global, rows, d, inside)
    if conds or global_address(tp, idx, lane(width - 1), rows, d, inside)[0]:
        return gathered()
    first = d.vload(tp.ctype, width, f"{tp.name} + {offs}")
    second = d.vload(tp.ctype, width, f"{tp.name} + {offs} + {width - 1}")
    load = f"(({vtype})({first}.even, {second}.odd))"
    if axis in clamp:
        # the vector across the end of a clamped run gathers its lanes clamped; the test folds where the run's
        # start is a constant (the edge version, VecFlavor.run_start)
        return f"({var_global(axis)} + {width - 1} < {clamp[axis]} ? {load} : {gathered()})"
    return load


def _transposed_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, width: int, vtype: str,
                     across: dict[str, int], d: Dialect) -> str | None:
    """A read strided along the vector axis and contiguous along another spatial axis of the thread tile (a
    transpose's ``X[i0,i1]`` for lanes along ``i0``), as ``width`` vector loads along that other axis, each
    giving one lane: the same loads serve the ``width`` vectors of the tile that lie along it, which the
    compiler shares (one vector load per lane instead of one scalar load per lane and vector). ``across``:
    the spatial axes whose thread runs are whole vectors and whose tiles are never partial, each with its
    decode divisor in the register-tile point index. None where no such axis is contiguous in the tensor."""
    for other, jdiv in across.items():
        if flat_coef(idx, tp.strides, other) != 1 or global_address(tp, idx, var_global, None, d)[0]:
            continue
        at = f"((rl_j / {jdiv}) % {width})"   # a constant once the register tile's loop is unrolled

        def lane(k: int, other: str = other, at: str = at) -> Callable[[str], str]:
            return lambda a: (f"({var_global(a)} + {k})" if a == axis else
                              f"({var_global(a)} - {at})" if a == other else var_global(a))

        loads = [f"{d.vload(tp.ctype, width, f'{tp.name} + {global_address(tp, idx, lane(k), None, d)[1]}')}[{at}]"
                 for k in range(width)]
        return f"({vtype})({', '.join(loads)})"
    return None


def stream_plan(expr: TensorExpr, inputs: list[TensorPlan], out: TensorPlan, d: Dialect, width: int,
                per_thread: int, block: int, grid: int) -> StreamPlan:
    """The vector form of an op with no reuse (construction/stream.py: one axis, every tensor read and written
    element for element): ``width``-element structs of ``d.stream_bytes`` at most, ``per_thread`` of them a
    thread. InputError where the dialect has no such form or the op is not of that shape."""
    axis = expr.axes[0] if len(expr.axes) == 1 else None
    if not d.stream_bytes or axis is None or expr.reduce_axes or expr.typed or expr.epilogue is not None:
        raise InputError(f"{expr.name}: {d.language} kernels render vector programs (RProgram.vector) only for "
                         "elementwise ops over one axis", field="vector")
    flat = (Affine.axis(axis.name),)
    plans = {tp.name: tp for tp in inputs}
    if expr.out_index != flat or any(idx != flat for tp in inputs for idx in expr.accesses(tp.name)):
        raise InputError(f"{expr.name}: a vector program reads and writes every tensor element for element",
                         field="vector")
    if width < 2 or width & (width - 1) or per_thread < 1:
        raise InputError(f"{expr.name}: vector width {width} x {per_thread} is not a power of two above 1 "
                         "times a positive count", field="vector")
    structs: dict[str, tuple[str, str, int]] = {}
    vtypes: dict[str, str] = {}
    for tp in [*inputs, out]:
        nbytes = width * _ctype_bytes(tp.ctype)
        if nbytes > d.stream_bytes:
            raise InputError(f"{expr.name}: {width} elements of {tp.name} ({tp.ctype}) are {nbytes} bytes, wider "
                             f"than {d.language}'s widest access ({d.stream_bytes})", field="vector")
        name = f"rl_vec{width}_{tp.ctype.strip('_').replace(' ', '_')}"
        structs[name] = (name, tp.ctype, nbytes)
        vtypes[tp.name] = name
    lane = render_body(expr.body, d, lambda r: element(plans[r.tensor], f"rl_x_{r.tensor}[rl_u].v[rl_k]", d),
                       axis=lambda a: f"(({d.real})(rl_e))")
    scalar = render_body(expr.body, d, lambda r: element(plans[r.tensor], f"{r.tensor}[rl_i]", d),
                         axis=lambda a: f"(({d.real})(rl_i))")
    uses_axis = any(isinstance(n, AxisValue) for n in walk(expr.body))
    # the grid-stride loops' indices pass the extent by up to one turn of the whole grid
    turn = grid * block * per_thread * width
    wide = axis.extent + turn >= 2**31
    return StreamPlan(width, per_thread, axis.extent, d.wide_int if wide else "int", list(structs.values()),
                      vtypes, (axis.extent // width) % (block * per_thread) != 0, lane, scalar, uses_axis)


def _ctype_bytes(ctype: str) -> int:
    """Bytes of one element of a C-family storage type (the floating types a vector program holds)."""
    return {"double": 8, "float": 4, "__half": 2, "__nv_bfloat16": 2, "half": 2}.get(ctype, 0) or \
        _unknown(ctype)


def _unknown(ctype: str) -> int:
    raise InputError(f"vector programs hold floating tensors; got elements of type {ctype}", field="vector")
