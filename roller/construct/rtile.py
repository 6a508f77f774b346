"""rTile and rProgram: what construction produces and every backend consumes."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from roller.ir.tensor_expr import TensorExpr


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


@dataclass(frozen=True)
class RProgram:
    """One rTile per memory layer below the outermost, plus the launch shape.

    ``tiles[i]`` is staged from ``layers[i]`` into ``layers[i + 1]``. ``block_level`` is the index of the tile
    one thread block / work-group / IPU tile computes, ``thread_level`` the one a thread computes."""

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
    use_matrix: bool = False
    prediction: Prediction | None = field(default=None, compare=False)

    @property
    def block_tile(self) -> RTile:
        return self.tiles[self.block_level]

    @property
    def thread_tile(self) -> RTile:
        return self.tiles[self.thread_level]

    def key(self) -> tuple:
        return (tuple(t.shape for t in self.tiles), self.reduce_threads, self.use_matrix)

    def line(self) -> str:
        parts = [f"{self.layers[i]}>{self.layers[i + 1]} {t.text()}" for i, t in enumerate(self.tiles)]
        parts += [f"grid {self.grid}", f"block {self.block}"]
        if self.reduce_threads > 1:
            parts.append(f"split-k {self.reduce_threads}")
        return " | ".join(parts)

    __str__ = line

    def threads_per_axis(self) -> tuple[int, ...]:
        """Threads along each spatial axis of the block tile (reduction axes: 1)."""
        b, t = self.block_tile.shape, self.thread_tile.shape
        return tuple(1 if a.reduce else b[i] // t[i] for i, a in enumerate(self.expr.axes))

    def blocks_per_axis(self) -> tuple[int, ...]:
        b = self.block_tile.shape
        return tuple(1 if a.reduce else -(-a.extent // b[i]) for i, a in enumerate(self.expr.axes))

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.expr.to_json(),
            "op_hash": self.expr.content_hash(),
            "axes": [{"name": a.name, "extent": a.extent, "reduce": a.reduce} for a in self.expr.axes],
            "hw": self.hw_name,
            "hw_hash": self.hw_hash,
            "layers": list(self.layers),
            "tiles": [{"from": self.layers[i], "to": self.layers[i + 1], "shape": list(t.shape),
                       "storage_padding": dict(t.storage_padding)} for i, t in enumerate(self.tiles)],
            "grid": self.grid,
            "block": self.block,
            "block_level": self.block_level,
            "thread_level": self.thread_level,
            "reduce_threads": self.reduce_threads,
            "use_matrix": self.use_matrix,
            "epsilon": self.epsilon,
            "padding_waste": self.padding_waste,
            "prediction": self.prediction.to_json() if self.prediction else None,
            "line": self.line(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


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
