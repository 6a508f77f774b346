"""Footprint and traffic of tiles, the two quantities the data-reuse score and the model are built on.

Tiles are tuples of extents in the order of ``expr.axes``. ``TileGeometry`` precomputes, for every tensor
dimension, which axes index it and with what coefficient, so a region is a few integer operations: this runs
thousands of times per construction.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from roller.ir.expr import Affine
from roller.ir.tensor_expr import TensorDecl, TensorExpr
from roller.ir.vector import flat_step, reduction_vector


@dataclass(frozen=True)
class _Dim:
    terms: tuple[tuple[int, int], ...]  # (axis position, |coefficient|)
    spread: int  # distance between the smallest and largest constant over all accesses
    size: int


@dataclass(frozen=True)
class _Tensor:
    name: str
    itemsize: int
    dims: tuple[_Dim, ...]
    is_output: bool


class TileGeometry:
    """Region and traffic queries for one expression, with tiles given as tuples in axis order."""

    def __init__(self, expr: TensorExpr) -> None:
        self.expr = expr
        self.axis_names = tuple(a.name for a in expr.axes)
        self.extents = tuple(a.extent for a in expr.axes)
        self.reduce_mask = tuple(a.reduce for a in expr.axes)
        pos = {a: i for i, a in enumerate(self.axis_names)}
        tensors = []
        for t in expr.tensors:
            accs = expr.accesses(t.name)
            dims = []
            for d, size in enumerate(t.shape):
                coefs: dict[int, int] = {}
                for idx in accs:
                    for a, c in idx[d].terms:
                        coefs[pos[a]] = max(coefs.get(pos[a], 0), abs(c))
                consts = [idx[d].const for idx in accs]
                dims.append(_Dim(tuple(sorted(coefs.items())), max(consts) - min(consts), size))
            tensors.append(_Tensor(t.name, t.itemsize, tuple(dims), t.name == expr.output.name))
        self.tensors = tuple(tensors)
        # What a reduction step stages and holds: the body's inputs. An epilogue's inputs count in the traffic
        # (``tensors``), read once per output point.
        body = {t.name for t in expr.body_inputs}
        self.inputs = tuple(t for t in self.tensors if t.name in body)
        self.output = next(t for t in self.tensors if t.is_output)
        self.flops_per_point = expr.flops_per_point
        self.total_bytes = expr.bytes   # stored sizes (a view's tensor once): what a cache has to hold
        # Whether the kernels read an input with a per-element guard: through an im2col view (index decoded
        # with divisions, then bounds-checked) or along a window or stride (h + r - 1, 2h: checked against the
        # padding). Guarded loads stay scalar on a CPU: 1.8-4.3 GFLOP/s on PoCL whatever the tile, against
        # 6-102 with plain loads (the model's calibrated compute, docs/model.md).
        # A window over a padded copy (RProgram.pads) never leaves its tensor: no test, plain loads (PoCL's 3x3
        # convolutions read so ran 100-280 GFLOP/s, the gathered table's speed being 5-55).
        gathered = any(t.view is not None and not t.view.is_reshape() for t in expr.body_inputs)
        extents = expr.extents
        windowed = any(i.terms and i.plain_axis() is None and
                       (i.span(extents)[0] < 0 or i.span(extents)[1] >= size)
                       for t in expr.body_inputs for acc in expr.accesses(t.name) for i, size in zip(acc, t.shape))
        self.guarded_reads = gathered or windowed
        # Whether a read is gathered lane by lane where CPU kernels vectorise (along the last spatial axis, the
        # fastest-varying one of a thread's register tile): through a view that moves with the axis, or with a
        # stride other than 1 (B[n,k] of a matmul with B transposed, a stride-2 window). Broadcast reads (the
        # axis does not index them) and unit-stride runs, windowed or not, are one load per vector.
        spatial = [i for i, r in enumerate(self.reduce_mask) if not r]
        self.vector_axis: int | None = spatial[-1] if spatial else None   # position in expr.axes
        axis = None if self.vector_axis is None else self.axis_names[self.vector_axis]
        self.lane_gathers = axis is not None and any(
            _lane_gathered(t, idx, axis, expr.extents) for t in expr.body_inputs for idx in expr.accesses(t.name))
        # A reduction whose rows are contiguous walks them in vectors instead (roller.ir.vector): no lane gathers,
        # no vector axis among the outputs, and vectors of ``width`` reduction points.
        # (The CPU dialect converts float16 vectors as it loads and stores them.)
        self.reduce_vector = reduction_vector(expr, frozenset({"float16"}))
        if self.reduce_vector is not None:
            self.vector_axis, self.lane_gathers = None, False
        # Whether the vector path stores its lanes one by one: the output does not run along the vector axis (a
        # convolution's output channels as the vector axis of an NCHW output).
        self.scattered_store = self.vector_axis is not None and expr.output.view is None and \
            flat_step(expr.output.shape, expr.out_index, axis or "") != 1
        # The spatial axes that index the output's dimension together with the vector axis (a weight layout
        # blocked along it splits one axis in two: Y[m, 16*n_o + n_i]): their thread runs are all vectors of the
        # same operand, so a register tile's columns are their product.
        self.vector_group: tuple[int, ...] = ()
        if self.vector_axis is not None:
            dim = next((i for i in expr.out_index if axis in i.coefs), None)
            self.vector_group = tuple(p for p in spatial if dim is not None and self.axis_names[p] in dim.coefs) \
                or (self.vector_axis,)

    def region(self, t: _Tensor, tile: tuple[int, ...]) -> tuple[int, ...]:
        out = []
        for d in t.dims:
            ext = d.spread + 1
            for a, c in d.terms:
                ext += c * (tile[a] - 1)
            out.append(min(ext, d.size))
        return tuple(out)

    def full_reduce(self, tile: tuple[int, ...]) -> tuple[int, ...]:
        """The same spatial tile over the whole reduction: what one tile reads to finish its outputs."""
        return tuple(e if r else t for t, e, r in zip(tile, self.extents, self.reduce_mask))

    def box(self, t: _Tensor, tile: tuple[int, ...]) -> tuple[int, ...]:
        """The region without clipping to the tensor: what a kernel stages, halo beyond the borders included
        (filled with the pad value). ``region`` clips, which is right for traffic, not for buffer sizes."""
        out = []
        for d in t.dims:
            ext = d.spread + 1
            for a, c in d.terms:
                ext += c * (tile[a] - 1)
            out.append(ext)
        return tuple(out)

    def footprint(self, tile: tuple[int, ...], padding: dict[str, int] | None = None) -> int:
        """Bytes of the input data tiles staged for one reduction step (storage padding included): whole
        boxes, as the C-family kernels allocate them (a 3x3 convolution's tile covering a 21-pixel-high image
        stages 23 rows, not 21; hipcc rejected such kernels over the 64 KiB LDS limit before)."""
        total = 0
        for t in self.inputs:
            reg = self.box(t, tile)
            if padding and padding.get(t.name) and len(reg) > 1:
                reg = reg[:-1] + (reg[-1] + padding[t.name],)
            total += math.prod(reg) * t.itemsize
        return total

    def tile_traffic(self, tile: tuple[int, ...], transaction_bytes: int = 1, epilogue: bool = True) -> int:
        """Bytes one tile moves from the layer above for its whole reduction: inputs plus the output once,
        each row of a data tile rounded up to whole transactions. ``epilogue=False`` leaves out what an
        epilogue reads (once per output point, from the outermost layer): construction ranks tiles by the
        body's reuse, so a fused bias does not change the tiles of the convolution it follows."""
        full = self.full_reduce(tile)
        total = 0
        for t in (self.tensors if epilogue else self.inputs + (self.output,)):
            reg = self.region(t, full)
            total += _rounded_bytes(reg, t.itemsize, transaction_bytes)
        return total

    def row_runs(self, tile: tuple[int, ...], output: bool = True) -> int:
        """Contiguous runs the whole operator moves when computed tile by tile: per tile and tensor, the rows
        of its region (each a separate run of the innermost dimension). At equal traffic, fewer and longer
        runs touch fewer DRAM pages and address translations: a 4096^2 transpose in 256x256 blocks moves 16
        KiB runs (0.49x the copy kernel's bandwidth on PoCL) where 4096x16 blocks move 64-byte ones (0.27x).
        Without the ``output`` (stored past the caches, HardwareDesc.streamed_from), the inputs' runs alone:
        streamed, the transpose's blocks with the longest input rows ran fastest (1024x64: 0.79-0.88x of the
        copy kernel, 256x256: 0.70-0.81x, 64x1024: 0.38-0.47x)."""
        full = self.full_reduce(tile)
        tensors = self.inputs + ((self.output,) if output else ())
        return self.num_tiles(tile) * sum(math.prod(self.region(t, full)[:-1]) for t in tensors)

    def num_tiles(self, tile: tuple[int, ...]) -> int:
        return math.prod(-(-e // t) for t, e, r in zip(tile, self.extents, self.reduce_mask) if not r)

    def total_traffic(self, tile: tuple[int, ...], transaction_bytes: int = 1, epilogue: bool = True) -> int:
        """Q(T): traffic of the whole operator when computed tile by tile."""
        return self.num_tiles(tile) * self.tile_traffic(tile, transaction_bytes, epilogue)

    def tile_flops(self, tile: tuple[int, ...]) -> int:
        """Work of one tile over its whole reduction (padding included: padded points are computed)."""
        full = self.full_reduce(tile)
        padded = [(-(-e // t) * t) if r else t for t, e, r in zip(full, self.extents, self.reduce_mask)]
        return math.prod(padded) * self.flops_per_point

    def padded_points(self, tile: tuple[int, ...]) -> int:
        return math.prod(-(-e // t) * t for t, e in zip(tile, self.extents))

    def padding_waste(self, tile: tuple[int, ...]) -> float:
        """Fraction of computed points that fall outside the iteration space."""
        real = math.prod(self.extents)
        return self.padded_points(tile) / real - 1.0

    def output_elems(self, tile: tuple[int, ...]) -> int:
        return math.prod(t for t, r in zip(tile, self.reduce_mask) if not r)


def _rounded_bytes(region: tuple[int, ...], itemsize: int, transaction: int) -> int:
    if not region:
        return max(itemsize, transaction)
    row = region[-1] * itemsize
    if transaction > 1:
        row = -(-row // transaction) * transaction
    return math.prod(region[:-1]) * row


def _lane_gathered(t: TensorDecl, idx: tuple[Affine, ...], axis: str, extents: Mapping[str, int]) -> bool:
    if not any(i.coefs.get(axis, 0) for i in idx):
        return False
    if t.view is not None and not t.view.is_reshape():
        return True
    stride, step = 1, 0
    for i, size in zip(reversed(idx), reversed(t.shape)):
        step += i.coefs.get(axis, 0) * stride
        stride *= size
    if step == 2:
        # a stride-2 run that never leaves the tensor (a padded copy's window) is two loads and their even and
        # odd lanes (plan.vector._stride2_read); one that needs bounds tests is gathered
        return not all(0 <= i.span(extents)[0] and i.span(extents)[1] < size for i, size in zip(idx, t.shape))
    return step != 1
