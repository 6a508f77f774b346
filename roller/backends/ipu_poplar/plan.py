"""Graph plan: an rProgram laid out as a Poplar graph (IPU tiles, vertices, and the tensor slices they connect).

Mapping (hardware.md section 3): the rProgram's tile at the tile-SRAM level is the work of one ``MultiVertex``;
its thread tiles go to the vertex's workers (worker ``w`` computes thread tile ``w``; construction keeps at
most 6 threads per block). Block ``b`` runs on IPU tile ``b % tiles`` in round ``b // tiles``; each round is
one compute set (one bulk-synchronous superstep), so a tile holds the copied-in regions of one vertex at a time.
A vertex connects, for every input, the bounding box of what its block reads over the whole reduction (the
exchange copies it in before compute), clipped to the tensor; points outside the tensor read the pad value.
Its output slice is exactly its block's output points, mapped to its own tile. Inputs live spread over the
tiles in contiguous chunks of ceil(size / tiles) elements.

The plan is plain data: ``vertex(b)`` gives one vertex, ``to_json`` the document written beside the generated
sources, and the C++ header ``graph_plan.hpp`` computes the same vertices for the host program.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from roller.construction.exchange import exchange_fed, on_device
from roller.errors import InputError
from roller.hw import HardwareDesc
from roller.ir.expr import Affine
from roller.ir.identifiers import check_identifier
from roller.ir.tensor_expr import TensorDecl
from roller.perf.traffic import TileGeometry
from roller.program import RProgram

FORMAT = "roller-ipu-graph-plan/1"
# graph_plan.json lists every vertex up to this many; beyond, it gives the rule that generates them (the same
# one graph_plan.hpp implements), which keeps plans of ops with millions of vertices a few kilobytes.
LIST_LIMIT = 16384


@dataclass(frozen=True)
class AxisMap:
    name: str
    extent: int
    reduce: bool
    block: int  # block tile extent (the whole extent for reduction axes)
    thread: int  # thread tile extent (1 for reduction axes)
    blocks: int  # block tiles along the axis
    bdiv: int  # divisor of the block index: position along this axis = (b // bdiv) % blocks
    threads: int  # threads (workers) along the axis
    tdiv: int  # divisor of the worker index
    jdiv: int  # divisor of the register-point index within a thread tile

    @property
    def partial(self) -> bool:
        """The last block along the axis is cut by the extent (its points beyond it are skipped)."""
        return not self.reduce and self.extent % self.block != 0


@dataclass(frozen=True)
class TensorMap:
    name: str
    output: bool
    shape: tuple[int, ...]  # the shape the vertices index (fused axes of a reshape merged)
    storage_shape: tuple[int, ...]  # the variable's shape (what the user passes)
    itemsize: int
    dims: tuple[tuple[Affine, ...], ...]  # per dimension: its index in every access of the tensor
    guards: tuple[bool, ...]  # per dimension: an access can leave the tensor (it reads the pad value there)
    chunk: int  # inputs: elements per tile of the linear mapping; outputs: 0 (mapped with their vertex)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Vertex:
    block: int
    tile: int
    round: int
    origin: tuple[int, ...]  # first point of the block tile, per spatial axis
    slices: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # tensor -> (begin, end), end exclusive


@dataclass(frozen=True)
class GraphPlan:
    op: str
    hw: str
    target: str
    codelet: str  # vertex class name
    statement: str
    line: str  # the rProgram in one line
    tiles: int
    workers: int
    tile_bytes: int
    spatial: tuple[AxisMap, ...]
    reduce: tuple[AxisMap, ...]
    inputs: tuple[TensorMap, ...]
    output: TensorMap
    vertices: int
    rounds: int
    threads: int  # workers a vertex uses
    thread_points: int  # points of one thread tile
    reduce_points: int
    on_device: bool  # the op's tensors live in the tiles' memory (roller.construction.exchange.on_device)
    pad_value: float

    @property
    def tensors(self) -> tuple[TensorMap, ...]:
        return self.inputs + (self.output,)

    # ---- vertices ---------------------------------------------------------------------------------------
    def ranges(self, b: int) -> dict[str, tuple[int, int]]:
        """Per axis, the (lowest, highest) point block ``b`` computes (reduction axes: all of them)."""
        out: dict[str, tuple[int, int]] = {}
        for a in self.spatial:
            lo = (b // a.bdiv) % a.blocks * a.block
            out[a.name] = (lo, min(lo + a.block, a.extent) - 1)
        for a in self.reduce:
            out[a.name] = (0, a.extent - 1)
        return out

    def slice_of(self, t: TensorMap, ranges: dict[str, tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The box of ``t`` that points within ``ranges`` read (or write), clipped to the tensor; a dimension
        read only outside the tensor gives an empty box (begin = end = 0)."""
        begin, end = [], []
        for size, accs in zip(t.shape, t.dims):
            lo = min(interval(i, ranges)[0] for i in accs)
            hi = max(interval(i, ranges)[1] for i in accs)
            lo, hi = max(lo, 0), min(hi, size - 1)
            if hi < lo:
                lo, hi = 0, -1
            begin.append(lo)
            end.append(hi + 1)
        if any(e == b for b, e in zip(begin, end)):
            zero = tuple(0 for _ in begin)
            return zero, zero
        return tuple(begin), tuple(end)

    def vertex(self, b: int) -> Vertex:
        if not 0 <= b < self.vertices:
            raise IndexError(b)
        r = self.ranges(b)
        return Vertex(b, b % self.tiles, b // self.tiles, tuple(r[a.name][0] for a in self.spatial),
                      {t.name: self.slice_of(t, r) for t in self.tensors})

    def all_vertices(self) -> Iterator[Vertex]:
        for b in range(self.vertices):
            yield self.vertex(b)

    # ---- memory -----------------------------------------------------------------------------------------
    def resident_input_bytes(self, tile: int) -> int:
        """Bytes of the inputs' linear mapping stored on ``tile``."""
        total = 0
        for t in self.inputs:
            first = tile * t.chunk
            total += max(0, min(t.chunk, t.size - first)) * t.itemsize
        return total

    def memory(self) -> dict[str, Any]:
        """Per-tile memory of the plan: exact over every vertex when they are listed, else an upper bound from
        the largest slice of every tensor. A tile holds its input chunks, its output slices (all rounds) and,
        during a round, the input slices copied in for its vertex."""
        cap = self.tile_bytes
        if self.vertices <= LIST_LIMIT:
            # tile -> [output bytes of all rounds, largest copied-in bytes, largest output + copied-in of a round]
            per_tile: dict[int, list[int]] = {}
            for v in self.all_vertices():
                out_b, in_b = self.slice_bytes(v)
                acc = per_tile.setdefault(v.tile, [0, 0, 0])
                acc[0] += out_b
                acc[1] = max(acc[1], in_b)
                acc[2] = max(acc[2], out_b + in_b)
            worst = (-1, 0, 0, 0)
            for tile, (outs, ins, round_max) in per_tile.items():
                res = self.resident_input_bytes(tile)
                total = res + outs + ins if self.on_device else round_max
                if total > worst[0]:
                    worst = (total, tile, res if self.on_device else 0, outs if self.on_device else 0)
            exact = True
            tile_max, worst_tile = worst[0], worst[1]
        else:
            largest = self.largest_slices()
            in_b = sum(math.prod(e) * t.itemsize for t, e in largest.items() if not t.output)
            out_b = math.prod(largest[self.output]) * self.output.itemsize
            res = self.resident_input_bytes(0)
            tile_max = res + self.rounds * out_b + in_b if self.on_device else out_b + in_b
            exact, worst_tile = False, None
        return {"capacity_bytes": cap, "tile_bytes_max": tile_max, "worst_tile": worst_tile, "exact": exact,
                "fits": tile_max <= cap, "on_device": self.on_device,
                "counted": ("input chunks + output slices of every round + the input slices copied in for one "
                            "round") if self.on_device else
                           ("the input slices copied in for one round + that round's output slice (the tensors "
                            "exceed the device's memory: they would live in streaming memory, not generated)")}

    def slice_bytes(self, v: Vertex) -> tuple[int, int]:
        """(output slice bytes, sum of input slice bytes) of a vertex."""
        out_b = in_b = 0
        for t in self.tensors:
            b, e = v.slices[t.name]
            n = math.prod(hi - lo for lo, hi in zip(b, e)) * t.itemsize
            if t.output:
                out_b += n
            else:
                in_b += n
        return out_b, in_b

    def largest_slices(self) -> dict[TensorMap, tuple[int, ...]]:
        """Per tensor, the largest extent per dimension over all vertices (each dimension on its own, so the
        product bounds every slice). Positions are enumerated only along the axes that index the dimension."""
        out: dict[TensorMap, tuple[int, ...]] = {}
        by_name = {a.name: a for a in self.spatial}
        for t in self.tensors:
            ext = []
            for d, (size, accs) in enumerate(zip(t.shape, t.dims)):
                axes = sorted({a for i in accs for a, _ in i.terms if a in by_name})
                combos = math.prod(by_name[a].blocks for a in axes)
                best = 0
                if combos > 1 << 16:  # too many positions: the unclipped extent bounds them all
                    full = {a.name: (0, a.block - 1) for a in self.spatial}
                    full.update({a.name: (0, a.extent - 1) for a in self.reduce})
                    lo = min(interval(i, full)[0] for i in accs)
                    hi = max(interval(i, full)[1] for i in accs)
                    best = min(hi - lo + 1, size)
                else:
                    for k in range(combos):
                        ranges = {a.name: (0, a.extent - 1) for a in self.reduce}
                        rest = k
                        for a in self.spatial:
                            if a.name in axes:
                                lo = rest % a.blocks * a.block
                                rest //= a.blocks
                            else:
                                lo = 0
                            ranges[a.name] = (lo, min(lo + a.block, a.extent) - 1)
                        b, e = self.slice_of(TensorMap(t.name, t.output, (size,), (size,), t.itemsize, (accs,),
                                                       t.guards[d:d + 1], 0), ranges)
                        best = max(best, e[0] - b[0])
                ext.append(best)
            out[t] = tuple(ext)
        return out

    # ---- documents --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "op": self.op, "hw": self.hw, "target": self.target, "codelet": self.codelet,
            "statement": self.statement, "rprogram": self.line,
            "tiles": self.tiles, "workers": self.workers, "vertices": self.vertices,
            "compute_sets": self.rounds, "workers_per_vertex": self.threads,
            "mapping": {
                "vertex_tile": "block % tiles", "vertex_round": "block // tiles (one compute set per round)",
                "inputs": "linear: tile t holds elements [t*chunk, (t+1)*chunk) of the flattened tensor",
                "output": "each vertex's output slice is mapped to the vertex's tile",
                "worker": "worker w computes thread tile w of its block; workers >= workers_per_vertex idle",
            },
            "tensors": [{"name": t.name, "role": "output" if t.output else "input", "shape": list(t.shape),
                         "storage_shape": list(t.storage_shape), "dtype": "float32",
                         "chunk": t.chunk or None} for t in self.tensors],
            "axes": [{"name": a.name, "extent": a.extent, "reduce": a.reduce, "block": a.block,
                      "blocks": a.blocks, "divisor": None if a.reduce else a.bdiv, "thread": a.thread,
                      "threads": a.threads}
                     for a in self.spatial + self.reduce],
            "slice_rule": {t.name: [[{"terms": dict(i.terms), "const": i.const} for i in accs] for accs in t.dims]
                           for t in self.tensors},
            "memory": self.memory(),
        }
        if self.vertices <= LIST_LIMIT:
            by_tile: dict[int, list[dict[str, Any]]] = {}
            for v in self.all_vertices():
                by_tile.setdefault(v.tile, []).append(
                    {"round": v.round, "block": v.block, "origin": list(v.origin),
                     "slices": {n: {"begin": list(b), "end": list(e)} for n, (b, e) in v.slices.items()}})
            doc["tile_vertices"] = [{"tile": t, "vertices": vs} for t, vs in sorted(by_tile.items())]
        else:
            doc["tile_vertices"] = None
            doc["tile_vertices_note"] = (f"{self.vertices} vertices (over {LIST_LIMIT}): not listed; vertex b has "
                                         "the slices slice_rule gives over the ranges of 'axes' at block b")
        return doc


def dumps(doc: dict[str, Any]) -> str:
    """JSON with one line per entry of every top-level list or object (one line per tile for the vertices),
    so that a plan of thousands of vertices stays readable and small."""
    def one(x: Any) -> str:
        return json.dumps(x, separators=(", ", ": "))

    items = []
    for k, v in doc.items():
        if isinstance(v, list) and v:
            text = "[\n" + ",\n".join("  " + one(x) for x in v) + "\n ]"
        elif isinstance(v, dict) and v:
            text = "{\n" + ",\n".join(f"  {json.dumps(kk)}: {one(vv)}" for kk, vv in v.items()) + "\n }"
        else:
            text = one(v)
        items.append(f" {json.dumps(k)}: {text}")
    return "{\n" + ",\n".join(items) + "\n}\n"


def interval(i: Affine, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(lowest, highest) value of an affine index over axis ranges."""
    lo = hi = i.const
    for a, c in i.terms:
        a_lo, a_hi = ranges[a]
        lo += c * (a_lo if c > 0 else a_hi)
        hi += c * (a_hi if c > 0 else a_lo)
    return lo, hi


def _tensor_map(t: TensorDecl, accesses: list[tuple[Affine, ...]], extents: dict[str, int], output: bool,
                tiles: int) -> TensorMap:
    if t.view is not None and not t.view.is_reshape():
        raise InputError(f"tensor {t.name} is read through a gather view; the poplar backend connects boxes of "
                         "tensors (construct for an IPU description: convolutions then stay direct)")
    if t.dtype != "float32":
        raise InputError(f"tensor {t.name} is {t.dtype}; the poplar backend generates float32 codelets only",
                         field="dtype")
    shape, storage = tuple(t.shape), tuple(t.storage_shape)
    if not shape:  # a scalar is a one-element vector (Poplar slices and C++ arrays need a dimension)
        shape, storage, accesses = (1,), (1,), [(Affine(),) for _ in accesses]
    dims = tuple(tuple(idx[d] for idx in accesses) for d in range(len(shape)))
    full = {a: (0, e - 1) for a, e in extents.items()}
    guards = []
    for size, accs in zip(shape, dims):
        lo = min(interval(i, full)[0] for i in accs)
        hi = max(interval(i, full)[1] for i in accs)
        guards.append(lo < 0 or hi >= size)
    return TensorMap(t.name, output, shape, storage, t.itemsize, dims, tuple(guards),
                     0 if output else -(-math.prod(shape) // tiles))


def plan(prog: RProgram, hw: HardwareDesc) -> GraphPlan:
    """The graph plan of ``prog`` on the IPU described by ``hw``."""
    expr = prog.expr
    if not exchange_fed(hw, prog.block_level):
        raise InputError(f"{hw.name}: the poplar backend needs a description whose outer layer is the tiles' "
                         "memories together (an IPU's 'remote' layer)", source=hw.source or None, field="memory")
    for name in [expr.name] + [t.name for t in expr.tensors] + [a.name for a in expr.axes]:
        problem = check_identifier(name)
        if problem:
            raise InputError(problem, field=expr.name)
    b_tile, t_tile = prog.block_tile.shape, prog.thread_tile.shape
    for a, b in zip(expr.axes, b_tile):
        if a.reduce and b != a.extent:
            raise InputError(f"{prog.line()}: the block tile steps through reduction axis {a.name} ({b} of "
                             f"{a.extent}); an IPU vertex receives its whole reduction (construct for an IPU "
                             "description)")
    for i in expr.out_index:
        if i.plain_axis() is None:
            raise InputError(f"output index {i} of {expr.name} is not a plain axis; the poplar backend writes "
                             "output boxes")
    tiles = hw.parallelism.compute_units
    workers = hw.parallelism.hardware_threads_per_unit or hw.parallelism.max_threads_per_unit
    spatial_raw = [(a, b, t) for a, b, t in zip(expr.axes, b_tile, t_tile) if not a.reduce]
    spatial: list[AxisMap] = []
    bdiv = tdiv = jdiv = 1
    # The last axis varies fastest in block, worker and register-point indices alike.
    for a, b, t in reversed(spatial_raw):
        blocks, threads = -(-a.extent // b), b // t
        spatial.insert(0, AxisMap(a.name, a.extent, False, b, t, blocks, bdiv, threads, tdiv, jdiv))
        bdiv *= blocks
        tdiv *= threads
        jdiv *= t
    reduce: list[AxisMap] = []
    rdiv = 1
    for a in reversed([a for a in expr.axes if a.reduce]):
        reduce.insert(0, AxisMap(a.name, a.extent, True, a.extent, 1, 1, rdiv, 1, 1, 1))
        rdiv *= a.extent
    threads = tdiv
    if threads > workers:
        raise InputError(f"{prog.line()}: {threads} threads per block, but an IPU tile has {workers} workers")
    extents = expr.extents
    inputs = tuple(_tensor_map(t, expr.accesses(t.name), extents, False, tiles) for t in expr.inputs)
    output = _tensor_map(expr.output, [expr.out_index], extents, True, tiles)
    vertices = bdiv
    return GraphPlan(
        op=expr.name, hw=hw.name, target=hw.target, codelet=f"rl_{expr.name}_vertex",
        statement=expr.statement(), line=prog.line(), tiles=tiles, workers=workers,
        tile_bytes=hw.memory[prog.block_level + 1].capacity_per_block_bytes or 0,
        spatial=tuple(spatial), reduce=tuple(reduce), inputs=inputs, output=output, vertices=vertices,
        rounds=-(-vertices // tiles), threads=threads, thread_points=jdiv, reduce_points=rdiv,
        on_device=on_device(TileGeometry(expr), hw, prog.block_level), pad_value=expr.pad_value)
