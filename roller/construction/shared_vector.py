"""Scalar programs that read their staged tiles in whole vectors (``RProgram.shared_vector``): a decision from the
description's block-scope layer (its ``vector_bytes``, LDS.128 on NVIDIA GPUs), not a constant of a template.

A scalar program's inner loop reads, per reduction point, one element of each staged input per thread point: a
float32 GEMM with an 8x8 thread tile issues 16 four-byte shared loads per 64 FMAs, which is exactly the shared
memory's bandwidth on an H100/H200 (128 bytes a cycle against 128 FMAs a cycle per SM), so no better schedule
of the FMAs can run faster (gpu-mainloops.md, the SIMT inner loop; nvcc 13 SASS: 512 FFMA, 128 LDS). Two
changes make each load 16 bytes (nvcc merges the reads into LDS.128 once it can prove their alignment):

* each staged row is whole vectors, an odd number of them (rule 2.2c counted in vectors: the rows one
  quarter-warp reads start in distinct bank groups), instead of one element of padding;
* threads own runs of V = ``vector_bytes`` / itemsize points along each spatial axis that is the plain innermost
  index of a staged input (a matmul's B[k, n]: n), runs ``threads`` x V apart; the innermost reduction axis of
  the others (A[m, k]: k) is walked in unrolled steps, V consecutive reads of one row.

The same rendered kernel then has 512 FFMA and 32 LDS.128. Applied only where every staged input is read so:
a tile padded to vectors but read element by element down its columns (a convolution's window, whose innermost
index is ``w + s``) meets 8-way bank conflicts that the one-element padding avoids.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from roller.construction.matrix import row_padding
from roller.hw import HardwareDesc
from roller.ir.tensor_expr import TensorExpr
from roller.perf.traffic import TileGeometry
from roller.program import Prediction, RProgram

#: the inner loop unrolls the reduction step by this many points (the GPU dialects' ``unroll_k``): the reads
#: of one row merge only within an unrolled run, so a vector may be at most this many elements
UNROLL_K = 8


def run_axes(expr: TensorExpr) -> list[str]:
    """The spatial axes that are the plain innermost index of some input of the body: along these a thread's
    points run contiguously in a staged row."""
    spatial = [a.name for a in expr.spatial_axes]
    out = []
    for t in expr.body_inputs:
        for idx in expr.accesses(t.name):
            a = idx[-1].plain_axis() if idx else None
            if a in spatial and a not in out:
                out.append(a)
    return [a for a in spatial if a in out]


def shared_vector_width(expr: TensorExpr, block: dict[str, int], thread: dict[str, int], vector_bytes: int) -> int:
    """The elements of one shared read with which every staged input of ``expr`` can be read, for these block
    and thread tiles, or 0. Each input: one access (no view, no gather) whose innermost index is one axis with
    coefficient 1, either a spatial axis whose thread run and block extent are whole vectors, or the op's one
    reduction axis, whose step is whole vectors and divides it; the inputs all of one element size."""
    sizes = {t.itemsize for t in expr.body_inputs}
    if len(sizes) != 1 or not expr.reduce_axes:
        return 0
    v = vector_bytes // sizes.pop()
    if v < 2 or v > UNROLL_K:
        return 0
    reduce = [a.name for a in expr.reduce_axes]
    for t in expr.body_inputs:
        accs = expr.accesses(t.name)
        if t.view is not None or len(accs) != 1 or not accs[0]:
            return 0
        a = accs[0][-1].plain_axis()
        if a is None:
            return 0
        if a in reduce:
            # a partial last step tests each point (``reduce_guard``), and nvcc merges no read across a test
            if len(reduce) != 1 or block[a] % v or expr.axis(a).extent % block[a]:
                return 0
        elif thread[a] % v or block[a] % v:
            return 0
    return v


def vector_padding(geo: TileGeometry, block: tuple[int, ...], vector_bytes: int) -> dict[str, int]:
    """Storage padding of each staged input of more than one row: whole ``vector_bytes`` rows, an odd number of
    vectors."""
    pads = {}
    for t in geo.inputs:
        box = geo.box(t, block)
        if len(box) > 1:
            p = row_padding(box[-1], t.itemsize, vector_bytes)
            if p:
                pads[t.name] = p
    return pads


def with_shared_vectors(prog: RProgram, hw: HardwareDesc,
                        predict: Callable[[RProgram, HardwareDesc], Prediction | None]) -> RProgram:
    """``prog`` reading its staged tiles in vectors where the description's block-scope layer gives a vector
    width and every staged input allows it (``shared_vector_width``), re-predicted with the wider padding
    (``predict``: construction's ``predict_program``); ``prog`` itself where not, or where the wider rows no
    longer fit."""
    layer = hw.memory[prog.block_level + 1]
    if prog.use_matrix or prog.vector > 1 or prog.shared_vector > 1 or layer.scope != "block" or \
            not layer.vector_bytes or prog.runtime or prog.expr.stages:
        return prog
    expr = prog.expr
    block = prog.block_tile.as_dict(expr)
    thread = prog.thread_tile.as_dict(expr)
    v = shared_vector_width(expr, block, thread, layer.vector_bytes)
    if not v:
        return prog
    geo = TileGeometry(expr)
    pads = vector_padding(geo, prog.block_tile.shape, layer.vector_bytes)
    cap = layer.capacity_per_block_bytes or 0
    if geo.footprint(prog.block_tile.shape, pads) > cap:
        return prog
    tiles = tuple(dataclasses.replace(t, storage_padding=tuple(sorted(pads.items()))) if i == prog.block_level
                  else t for i, t in enumerate(prog.tiles))
    new = dataclasses.replace(prog, tiles=tiles, shared_vector=v)
    pred = predict(new, hw)
    if pred is None:
        return prog
    return dataclasses.replace(new, prediction=pred)


def runs(prog: RProgram) -> dict[str, int]:
    """The run length of each spatial axis along which ``prog``'s threads own contiguous points (the others:
    none, threads interleave point by point)."""
    if prog.shared_vector <= 1:
        return {}
    thread = prog.thread_tile.as_dict(prog.expr)
    return {a: prog.shared_vector for a in run_axes(prog.expr) if thread[a] % prog.shared_vector == 0}
