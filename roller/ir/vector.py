"""How a thread's run of outputs along the vector axis becomes vectors on a CPU: one rule for the C-family
lowering (roller/backends/c_family/plan/schedule.py), the probe's register-tile kernels and the model's edge term."""
from __future__ import annotations

from roller.ir.expr import Affine
from roller.ir.tensor_expr import TensorExpr

VECTOR_WIDTHS = (16, 8, 4, 2)  # the C-family vector types' sizes (3 is padded to 4 in memory: not useful here)


def vector_width(run: int) -> int:
    """The widest vector that divides a thread's run along the vector axis, or 0: the scalar loop."""
    return next((w for w in VECTOR_WIDTHS if run % w == 0), 0)


def flat_step(shape: tuple[int, ...], index: tuple[Affine, ...], axis: str) -> int:
    """How far one step along ``axis`` moves the row-major offset of ``index`` (``Affine`` per dimension) into
    a tensor of ``shape``."""
    step, stride = 0, 1
    for i, size in zip(reversed(index), reversed(shape)):
        step += i.coefs.get(axis, 0) * stride
        stride *= size
    return step


def reduction_vector(expr: TensorExpr, converted: frozenset[str] = frozenset()) -> tuple[str, int] | None:
    """(axis, width) where a CPU kernel walks the reduction in vectors along its innermost axis instead of
    vectorising the outputs along the last spatial axis, else None.

    That is the form of a row sum, ``Y[i] += X[i, k]``: along the spatial axis every lane reads another row
    (gathered lane by lane: 0.25x the copy kernel's bandwidth on PoCL), along ``k`` each read is one vector
    load (2x and more, same process). It applies where a reduction's inputs gain nothing from a register tile
    (every input moves with every spatial axis, so no read is shared between outputs), where every input that
    moves with the innermost reduction axis moves by one element, where some input moves along the last
    spatial axis by other than one element (else vectors along it load whole, as now), and where the axis is
    at least one 8-wide vector long. ``converted``: element types the backend loads and stores as vectors of
    the accumulator's type (float16 where the backend holds it as bits it converts)."""
    if expr.reduce_op is None or expr.stages or not expr.reduce_axes or expr.epilogue_inputs:
        return None
    if any(t.dtype != expr.acc_dtype and t.dtype not in converted for t in expr.tensors):
        return None
    axis = expr.reduce_axes[-1]
    width = next((w for w in VECTOR_WIDTHS if w <= axis.extent), 0)
    if width < 8:
        return None
    spatial = [a.name for a in expr.spatial_axes]
    moving = gathered = False
    for t in expr.body_inputs:
        if t.view is not None and not t.view.is_reshape():
            return None
        for idx in expr.accesses(t.name):
            used = {a for i in idx for a, _ in i.terms}
            if any(a not in used for a in spatial):
                return None
            step = flat_step(t.shape, idx, axis.name)
            if step not in (0, 1):
                return None
            moving = moving or step == 1
            if spatial and flat_step(t.shape, idx, spatial[-1]) != 1:
                gathered = True
    if not moving or (spatial and not gathered):
        return None
    return axis.name, width
