"""The program types every layer shares: rTile, rProgram and the model's Prediction.

Construction produces them, the model fills in the prediction, the backends render them, and the cache, the
API and ``roller build`` store and reload them. This module imports only the IR, so each of those imports it
downward. An rProgram serialises itself with the preparation of its expression (``RProgram.to_json`` /
``from_json``): reloading applies the recorded fusion again instead of deciding it again.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roller.ir.fuse import reprepare
from roller.ir.opfile import load_op
from roller.ir.tensor_expr import Preparation, TensorExpr


@dataclass(frozen=True)
class RTile:
    """A tile over all axes (spatial and reduction) of the expression, plus storage padding per input.

    ``shape`` follows ``expr.axes``. At a staging level the reduction extents are the step staged per
    iteration; ``storage_padding[t]`` extra elements pad the innermost dimension of input ``t``'s buffer."""

    shape: tuple[int, ...]
    storage_padding: tuple[tuple[str, int], ...] = ()

    def padding(self, tensor: str) -> int:
        return dict(self.storage_padding).get(tensor, 0)

    def as_dict(self, expr: TensorExpr) -> dict[str, int]:
        return {a.name: s for a, s in zip(expr.axes, self.shape)}

    def text(self) -> str:
        return "x".join(str(s) for s in self.shape)


@dataclass(frozen=True)
class Prediction:
    """What the micro-performance model says about one rProgram."""

    time_s: float
    bottleneck: str  # "compute" or the name of the memory layer whose traffic dominates
    fraction_of_peak: float  # useful FLOP/s over the device's effective peak
    layer_times_s: tuple[tuple[str, float], ...]
    compute_time_s: float
    waves: int
    blocks_per_unit: int
    registers_per_thread: int

    @property
    def time_ms(self) -> float:
        return self.time_s * 1e3

    def to_json(self) -> dict[str, Any]:
        return {"time_ms": self.time_s * 1e3, "bottleneck": self.bottleneck,
                "fraction_of_peak": self.fraction_of_peak,
                "layer_times_ms": {k: v * 1e3 for k, v in self.layer_times_s},
                "compute_time_ms": self.compute_time_s * 1e3, "waves": self.waves,
                "blocks_per_unit": self.blocks_per_unit, "registers_per_thread": self.registers_per_thread}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Prediction:
        return Prediction(time_s=float(doc["time_ms"]) / 1e3, bottleneck=str(doc["bottleneck"]),
                          fraction_of_peak=float(doc["fraction_of_peak"]),
                          layer_times_s=tuple((str(k), float(v) / 1e3) for k, v in doc["layer_times_ms"].items()),
                          compute_time_s=float(doc["compute_time_ms"]) / 1e3, waves=int(doc["waves"]),
                          blocks_per_unit=int(doc["blocks_per_unit"]),
                          registers_per_thread=int(doc["registers_per_thread"]))


@dataclass(frozen=True)
class MatrixChoice:
    """The matrix instruction construction chose for a program (a description's ``matrix_instructions``
    entry): the backend renders exactly this one."""

    family: str  # "wmma" (NVIDIA warp fragments) | "mfma" (AMD wavefront matrix cores)
    name: str
    shape: tuple[int, int, int]  # (m, n, k)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "name": self.name, "shape": list(self.shape)}

    @staticmethod
    def from_json(doc: Any) -> MatrixChoice | None:
        if doc is None:
            return None
        shape = tuple(int(s) for s in doc["shape"])
        if len(shape) != 3:
            raise ValueError(f"matrix instruction shape must be (m, n, k), got {doc['shape']!r}")
        return MatrixChoice(str(doc["family"]), str(doc["name"]), (shape[0], shape[1], shape[2]))


@dataclass(frozen=True)
class RProgram:
    """One rTile per memory layer below the outermost, plus the launch shape.

    ``tiles[i]`` is staged from ``layers[i]`` into ``layers[i + 1]``. ``block_level`` is the index of the tile
    one thread block / work-group / IPU tile computes, ``thread_level`` the one a thread computes (for a
    matrix program, the one a warp computes with ``matrix``)."""

    expr: TensorExpr
    hw_name: str
    hw_hash: str
    layers: tuple[str, ...]
    scopes: tuple[str, ...]
    tiles: tuple[RTile, ...]
    grid: int
    block: int
    block_level: int
    thread_level: int
    reduce_threads: int = 1
    epsilon: float = 0.0
    padding_waste: float = 0.0
    matrix: MatrixChoice | None = None
    # Axes whose extent is a kernel argument (axis name, factor): the kernel is built over ``expr`` (the op at
    # its symbol's greatest value, which sets every tensor's layout) and takes the symbol's value ``n`` at
    # launch; each such axis then runs to ``factor * n`` (roller.construction.symbol_args).
    runtime: tuple[tuple[str, int], ...] = ()
    # Elements of one access along the single (contiguous) axis of an op with no reuse (construction/stream.py):
    # above 1, each thread moves its thread tile as vectors this wide, and the ``grid`` blocks walk the
    # block tiles in a grid-stride loop (``grid`` may be fewer than the tiles).
    vector: int = 1
    # Steps of the staged reduction in flight at once: the block-scope layer holds a ring of this many staged
    # tiles, filled by asynchronous copies ``stages - 1`` steps ahead of the one computed (1: each step is
    # staged, then computed). Construction decides it from the description (construction/pipeline.py).
    stages: int = 1
    # Elements of one read from the block-scope layer (construction/shared_vector.py): above 1, every staged
    # row is whole vectors this wide and threads own runs of this many points along the axes those rows run
    # along, so that each read of the inner loop is one vector (LDS.128); 1: element by element.
    shared_vector: int = 1
    prediction: Prediction | None = field(default=None, compare=False)

    @property
    def use_matrix(self) -> bool:
        return self.matrix is not None

    @property
    def block_tile(self) -> RTile:
        return self.tiles[self.block_level]

    @property
    def thread_tile(self) -> RTile:
        return self.tiles[self.thread_level]

    def key(self) -> tuple:
        return (tuple(t.shape for t in self.tiles), self.reduce_threads,
                self.matrix.name if self.matrix else None, self.runtime, self.vector, self.stages, self.shared_vector)

    def line(self) -> str:
        parts = [f"{self.layers[i]}>{self.layers[i + 1]} {t.text()}" for i, t in enumerate(self.tiles)]
        parts += [f"grid {self.grid}", f"block {self.block}"]
        if self.reduce_threads > 1:
            parts.append(f"split-k {self.reduce_threads}")
        if self.vector > 1:
            parts.append(f"vector {self.vector} grid-stride")
        if self.runtime:
            parts.append("runtime " + ",".join(a if f == 1 else f"{a}={f}n" for a, f in self.runtime))
        if self.stages > 1:
            parts.append(f"stages {self.stages}")
        if self.shared_vector > 1:
            parts.append(f"shared-vector {self.shared_vector}")
        return " | ".join(parts)

    __str__ = line

    def threads_per_axis(self) -> tuple[int, ...]:
        """Threads along each spatial axis of the block tile (reduction axes: 1)."""
        b, t = self.block_tile.shape, self.thread_tile.shape
        return tuple(1 if a.reduce else b[i] // t[i] for i, a in enumerate(self.expr.axes))

    def blocks_per_axis(self) -> tuple[int, ...]:
        b = self.block_tile.shape
        return tuple(1 if a.reduce else -(-a.extent // b[i]) for i, a in enumerate(self.expr.axes))

    @property
    def pads(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Inputs the kernel reads from padded copies: name -> (before, after) per dimension of the input as
        written. Whoever runs the kernel passes, for each, a buffer of the padded shape holding the input in its
        interior and the op's ``pad_value`` around it (``pad_input``)."""
        prep = self.expr.preparation
        return dict(prep.pads) if prep is not None else {}

    def to_json(self) -> dict[str, Any]:
        src = self.expr.source or self.expr
        return {
            "op": self.expr.to_json(),
            "source_hash": src.content_hash(),
            "preparation": self.expr.preparation.to_json() if self.expr.preparation else None,
            "op_hash": self.expr.content_hash(),
            "axes": [{"name": a.name, "extent": a.extent, "reduce": a.reduce} for a in self.expr.axes],
            "hw": self.hw_name,
            "hw_hash": self.hw_hash,
            "layers": list(self.layers),
            "scopes": list(self.scopes),
            "tiles": [{"from": self.layers[i], "to": self.layers[i + 1], "shape": list(t.shape),
                       "storage_padding": dict(t.storage_padding)} for i, t in enumerate(self.tiles)],
            "grid": self.grid,
            "block": self.block,
            "block_level": self.block_level,
            "thread_level": self.thread_level,
            "reduce_threads": self.reduce_threads,
            "use_matrix": self.use_matrix,
            "matrix": self.matrix.to_json() if self.matrix else None,
            "epsilon": self.epsilon,
            "padding_waste": self.padding_waste,
            "runtime_axes": [{"axis": a, "factor": f} for a, f in self.runtime],
            "vector": self.vector,
            "stages": self.stages,
            "shared_vector": self.shared_vector,
            "prediction": self.prediction.to_json() if self.prediction else None,
            "line": self.line(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @staticmethod
    def from_json(doc: Mapping[str, Any], source: TensorExpr | None = None) -> RProgram:
        """The program ``to_json`` wrote. ``source`` is the op as written, when the caller has it (it must be
        the op the program was built for); otherwise the op is read from the document. The recorded
        preparation is applied to it again. ValueError (or KeyError / TypeError) for a document that does not
        describe a consistent program of that op."""
        if source is None:
            source = load_op(dict(doc["op"]))
        elif source.source is not None:
            raise ValueError("from_json takes the op as written, not a prepared expression")
        if "source_hash" in doc and doc["source_hash"] != source.content_hash():
            raise ValueError("rProgram belongs to another op")
        expr = reprepare(source, Preparation.from_json(doc.get("preparation")))
        if doc.get("op_hash") != expr.content_hash():
            raise ValueError("rProgram belongs to another op (or another preparation of it)")
        layers = tuple(str(x) for x in doc["layers"])
        scopes = tuple(str(x) for x in doc["scopes"])
        tiles = tuple(RTile(tuple(int(s) for s in t["shape"]),
                            tuple(sorted((str(k), int(v)) for k, v in t["storage_padding"].items())))
                      for t in doc["tiles"])
        if len(scopes) != len(layers) or len(tiles) != len(layers) - 1 or \
                any(len(t.shape) != len(expr.axes) for t in tiles):
            raise ValueError("rProgram's tiles do not match its layers or its op's axes")
        block_level, thread_level = int(doc["block_level"]), int(doc["thread_level"])
        if not 0 <= block_level <= thread_level < len(tiles):
            raise ValueError("rProgram's block and thread levels are out of range")
        pred = doc.get("prediction")
        runtime = tuple((str(r["axis"]), int(r["factor"])) for r in doc.get("runtime_axes", []))
        names = {a.name for a in expr.axes}
        if any(a not in names or f < 1 for a, f in runtime):
            raise ValueError("rProgram's runtime axes are not axes of its op")
        vector = int(doc.get("vector", 1))
        if vector < 1 or vector & (vector - 1):
            raise ValueError(f"rProgram's vector width must be a power of two, got {vector}")
        stages = int(doc.get("stages", 1))
        if not 1 <= stages <= 16:
            raise ValueError(f"rProgram's stages must be 1 to 16, got {stages}")
        shared_vector = int(doc.get("shared_vector", 1))
        if shared_vector not in (1, 2, 4, 8):
            raise ValueError(f"rProgram's shared_vector must be 1, 2, 4 or 8, got {shared_vector}")
        return RProgram(expr=expr, hw_name=str(doc["hw"]), hw_hash=str(doc["hw_hash"]), layers=layers,
                        scopes=scopes, tiles=tiles, grid=int(doc["grid"]), block=int(doc["block"]),
                        block_level=block_level, thread_level=thread_level,
                        reduce_threads=int(doc.get("reduce_threads", 1)),
                        epsilon=float(doc.get("epsilon", 0.0)), padding_waste=float(doc.get("padding_waste", 0.0)),
                        matrix=MatrixChoice.from_json(doc.get("matrix")), runtime=runtime, vector=vector,
                        stages=stages, shared_vector=shared_vector,
                        prediction=Prediction.from_json(pred) if pred is not None else None)

    @staticmethod
    def loads(text: str, source: TensorExpr | None = None) -> RProgram:
        return RProgram.from_json(json.loads(text), source)


def launch_counts(expr: TensorExpr, block: RTile, thread: RTile, reduce_threads: int = 1) -> tuple[int, int]:
    """(grid, threads per block) of a block tile split into thread tiles."""
    grid = 1
    threads = reduce_threads
    for a, b, t in zip(expr.axes, block.shape, thread.shape):
        if a.reduce:
            continue
        grid *= -(-a.extent // b)
        threads *= b // t
    return grid, max(1, threads) if math.prod(block.shape) else 1


def pad_input(array: Any, pads: tuple[tuple[int, int], ...], value: float) -> Any:
    """``array`` in the interior of a padded copy filled with ``value`` (what a program's ``pads`` ask for)."""
    import numpy as np

    return np.pad(np.asarray(array), [(b, a) for b, a in pads], mode="constant", constant_values=value)


def pad_value_json(v: float) -> float | str:
    """JSON has no infinity: "-inf" / "inf" as op files write them."""
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v
