"""Typed, frozen view of one hardware description (the YAML files in ``roller/hwdesc``).

Units: sizes in bytes, bandwidth in GB/s (10^9 bytes per second, whole device), compute in TFLOP/s.
The loader (``roller.hw.loader``) is the only producer; everything device-specific that construction, the
performance model and the backends read comes from these objects.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from roller import dtypes
from roller.errors import InputError

SCOPES = ("device", "cache", "block", "thread")
DTYPES = tuple(dtypes.DTYPES)


class FrozenDict(dict):
    """A dict that cannot be changed after construction and can be hashed (keeps dataclasses frozen)."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("hardware descriptions are read-only")

    __setitem__ = __delitem__ = _readonly
    clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]
    __ior__ = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple:
        return (FrozenDict, (dict(self),))


@dataclass(frozen=True)
class MemoryLayer:
    """One level of the memory hierarchy; ``memory[0]`` is the outermost (DRAM/HBM, exchange)."""

    name: str
    scope: str                               # device | cache | block | thread
    capacity_bytes: int | None               # whole layer on the device (device / cache scope)
    capacity_per_unit_bytes: int | None      # per SM / CU / tile / core (block, thread; optional for cache)
    capacity_per_block_bytes: int | None     # what one block/work-group may use (block scope)
    capacity_per_thread_bytes: int | None    # what one thread may use (thread scope: registers)
    bandwidth_peak_gbps: float               # whole device, GB/s
    bandwidth_effective_gbps: float          # whole device, GB/s, measured or derated; <= peak
    transaction_bytes: int                   # smallest access the layer serves
    line_bytes: int                          # coalescing unit / cache line / one row of banks
    banks: int | None = None                 # block scope: number of banks
    bank_width_bytes: int | None = None      # block scope: bytes per bank per cycle
    # device scope: stores of whole transactions can bypass the caches (x86 non-temporal stores), so that a
    # store to a line that is not cached needs no read of it first
    streaming_stores: bool = False
    # cache scope: addresses this many bytes apart share a set of the smallest data cache that loads through
    # this layer pass (a CPU core's L1: its capacity / ways, 4 KiB on x86), so rows that far apart compete for
    # that set's few ways
    alias_bytes: int | None = None
    # device scope: the widest access one thread issues in one instruction (16 on NVIDIA GPUs: LDG.E.128);
    # ops with no reuse read and write their contiguous axis in vectors this wide (construction/stream.py).
    # block scope: the widest read of the layer (LDS.128): scalar programs whose staged rows are read along
    # whole vectors pad them to vectors and own runs of them (construction/shared_vector.py)
    vector_bytes: int | None = None
    # device scope: the loaded latency of one access, ns (an estimate until measured): the model limits the
    # bandwidth a program reaches by the bytes its resident blocks keep in flight (Little's law,
    # perf/micro.py), and a staged step is fetched this far ahead of its use (construction/pipeline.py)
    latency_ns: float | None = None
    # block scope: what one block may use when its kernel opts in past capacity_per_block_bytes (a launch
    # attribute, e.g. for dynamic shared memory); only a ring of staged steps uses it (None: no opt-in)
    capacity_per_block_optin_bytes: int | None = None
    # block scope: how many staged steps may be in flight in the layer at once (asynchronous copies, cp.async);
    # 1: each step is staged, then computed
    max_stages: int = 1

    @property
    def capacity(self) -> int:
        """What one consumer of this layer can hold: device/cache total, per block, or per thread."""
        if self.scope == "block":
            return int(self.capacity_per_block_bytes or 0)
        if self.scope == "thread":
            return int(self.capacity_per_thread_bytes or 0)
        return int(self.capacity_bytes or 0)


@dataclass(frozen=True)
class Parallelism:
    compute_units: int              # SMs, CUs, IPU tiles, CPU cores
    sub_partitions: int             # warp schedulers / SIMDs per unit
    warp_size: int                  # threads issued together (32 NVIDIA, 64 CDNA, 1 IPU, SIMD lanes on a CPU)
    max_threads_per_block: int
    max_threads_per_unit: int
    max_blocks_per_unit: int
    registers_per_unit: int         # 32-bit registers per unit
    max_registers_per_thread: int
    register_tile_budget: int       # elements of the register tile one thread may hold (ROLLER reg_cap[1])
    hardware_threads_per_unit: int | None = None   # IPU worker contexts per tile (6); None elsewhere
    # most blocks construction may split one output tile's reduction over (split-K); 1: never split
    max_split_k: int = 8

    @property
    def max_warps_per_unit(self) -> int:
        return self.max_threads_per_unit // self.warp_size


@dataclass(frozen=True)
class ComputePeak:
    peak_tflops: float
    effective_tflops: float


@dataclass(frozen=True)
class DtypeCompute:
    vector: ComputePeak
    matrix: ComputePeak | None = None


@dataclass(frozen=True)
class MatrixInstruction:
    name: str
    shape: tuple[int, int, int]     # (m, n, k)
    input_dtype: str
    accumulator_dtype: str


@dataclass(frozen=True)
class TileThroughput:
    """FP32 throughput one thread reaches with a ``rows`` x ``cols`` register tile of accumulators (``cols``
    the run along the last spatial axis, which CPU kernels hold in vectors), measured on the whole device
    with the C-family kernels' inner loop."""

    rows: int
    cols: int
    gflops: float


@dataclass(frozen=True)
class Calibration:
    """What ``roller hw probe`` measured beyond the peaks; the model uses each value that is present."""

    launch_us: float | None = None       # an empty kernel, launch to completion (event-timed)
    per_block_us: float | None = None    # added per work-group a unit runs (slope over many empty groups)
    join_us: float | None = None         # how long after the first unit the others start taking work-groups
    register_tiles: tuple[TileThroughput, ...] = ()
    gathered_tiles: tuple[TileThroughput, ...] = ()   # the same loop with gathered reads (probe.py, GATHER)

    def tile_flops(self, rows: int, cols: int, gathered: bool = False) -> float | None:
        """FLOP/s of the measured register tile nearest to ``rows`` x ``cols`` (distance in log2 of both
        sides: throughput follows the tile's shape, not its area alone; equally near ones give their
        geometric mean), or None without measurements. ``gathered`` looks in the gathered-read table first."""
        tiles = (self.gathered_tiles if gathered else ()) or self.register_tiles
        if not tiles:
            return None
        lr, lc = math.log2(max(rows, 1)), math.log2(max(cols, 1))
        dist = [(math.log2(t.rows) - lr) ** 2 + (math.log2(t.cols) - lc) ** 2 for t in tiles]
        near = [t.gflops for t, d in zip(tiles, dist) if d <= min(dist) + 1e-9]
        return (near[0] if len(near) == 1 else math.exp(sum(math.log(g) for g in near) / len(near))) * 1e9

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.launch_us is not None:
            out["launch_us"] = self.launch_us
        if self.per_block_us is not None:
            out["per_block_us"] = self.per_block_us
        if self.join_us is not None:
            out["join_us"] = self.join_us
        for key, tiles in (("register_tile_gflops", self.register_tiles),
                           ("gathered_tile_gflops", self.gathered_tiles)):
            if tiles:
                out[key] = [{"rows": t.rows, "cols": t.cols, "gflops": t.gflops} for t in tiles]
        return out


@dataclass(frozen=True)
class HardwareDesc:
    name: str
    vendor: str
    backend: str                    # the backend that renders its programs (a roller.backends declaration)
    target: str                     # what that backend compiles for (its target_pattern)
    memory: tuple[MemoryLayer, ...]             # outermost first, len >= 2
    parallelism: Parallelism
    compute: Mapping[str, DtypeCompute]         # keyed by dtype name (a read-only dict)
    matrix_instructions: tuple[MatrixInstruction, ...] = ()
    notes: str = ""
    calibration: Calibration | None = None
    source: str = field(default="", compare=False)   # path of the YAML (not part of equality or hash)

    # -- conveniences used by construction and the model ------------------------------------------
    def layer(self, name: str | int) -> MemoryLayer:
        """The memory layer with this name (or index)."""
        if isinstance(name, int):
            return self.memory[name]
        for layer in self.memory:
            if layer.name == name:
                return layer
        names = ", ".join(layer.name for layer in self.memory)
        raise KeyError(f"{self.name} has no memory layer {name!r} (layers: {names})")

    def layer_index(self, name: str) -> int:
        return self.memory.index(self.layer(name))

    def bandwidth(self, i: int | str, *, peak: bool = False) -> float:
        """Bandwidth of memory layer ``i`` (index or name) in bytes/s, whole device; effective by default."""
        layer = self.layer(i)
        gbps = layer.bandwidth_peak_gbps if peak else layer.bandwidth_effective_gbps
        return gbps * 1e9

    def streamed_from(self) -> int | None:
        """The output size in bytes from which kernels store past the caches, where the global layer takes
        streaming stores: more than the cache layers (and the block layers, on every unit) hold together."""
        if not self.memory[0].streaming_stores:
            return None
        units = self.parallelism.compute_units
        return 1 + sum((m.capacity_bytes or 0) if m.scope == "cache" else (m.capacity_per_unit_bytes or 0) * units
                       for m in self.memory[1:] if m.scope in ("cache", "block"))

    def peak_flops(self, dtype: str = "float32", matrix: bool = False, *, peak: bool = False) -> float:
        """Compute throughput in FLOP/s (effective by default) for ``dtype`` on vector or matrix units."""
        entry = self.compute.get(dtype)
        if entry is None:
            have = ", ".join(self.compute)
            raise InputError(f"{self.name} has no compute entry for dtype {dtype!r} (has: {have})")
        unit = entry.matrix if matrix else entry.vector
        if unit is None:
            raise InputError(f"{self.name} has no matrix units for dtype {dtype!r}")
        return (unit.peak_tflops if peak else unit.effective_tflops) * 1e12

    def has_matrix(self, dtype: str) -> bool:
        entry = self.compute.get(dtype)
        return entry is not None and entry.matrix is not None

    def matrix_instructions_for(self, input_dtype: str) -> tuple[MatrixInstruction, ...]:
        return tuple(mi for mi in self.matrix_instructions if mi.input_dtype == input_dtype)

    def iter_layers(self) -> Iterator[tuple[int, MemoryLayer]]:
        return iter(enumerate(self.memory))

    def to_dict(self) -> dict[str, Any]:
        """The normalized description in the YAML's shape (sizes in bytes); ``load`` accepts it back."""
        memory = []
        for layer in self.memory:
            d: dict[str, Any] = {"name": layer.name, "scope": layer.scope}
            d.update(_given(layer, "capacity_bytes", "capacity_per_unit_bytes", "capacity_per_block_bytes",
                            "capacity_per_thread_bytes"))
            d["bandwidth_gbps"] = {"peak": layer.bandwidth_peak_gbps,
                                   "effective": layer.bandwidth_effective_gbps}
            d["transaction_bytes"] = layer.transaction_bytes
            d["line_bytes"] = layer.line_bytes
            d.update(_given(layer, "banks", "bank_width_bytes"))
            if layer.streaming_stores:
                d["streaming_stores"] = True
            d.update(_given(layer, "alias_bytes", "vector_bytes", "latency_ns", "capacity_per_block_optin_bytes"))
            if layer.max_stages != 1:
                d["max_stages"] = layer.max_stages
            memory.append(d)
        par = {k: getattr(self.parallelism, k) for k in self.parallelism.__dataclass_fields__}
        if par["hardware_threads_per_unit"] is None:
            del par["hardware_threads_per_unit"]
        if par["max_split_k"] == Parallelism.max_split_k:   # the default: descriptions without it hash as before
            del par["max_split_k"]
        compute: dict[str, Any] = {}
        for dtype, entry in self.compute.items():
            c: dict[str, Any] = {"vector": {"peak_tflops": entry.vector.peak_tflops,
                                            "effective_tflops": entry.vector.effective_tflops}}
            if entry.matrix is not None:
                c["matrix"] = {"peak_tflops": entry.matrix.peak_tflops,
                               "effective_tflops": entry.matrix.effective_tflops}
            compute[dtype] = c
        out: dict[str, Any] = {"name": self.name, "vendor": self.vendor, "backend": self.backend,
                               "target": self.target}
        if self.notes:
            out["notes"] = self.notes
        out["memory"] = memory
        out["parallelism"] = par
        out["compute"] = compute
        out["matrix_instructions"] = [
            {"name": mi.name, "shape": list(mi.shape), "input_dtype": mi.input_dtype,
             "accumulator_dtype": mi.accumulator_dtype} for mi in self.matrix_instructions]
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        return out

    def content_hash(self) -> str:
        """Stable hex digest of the normalized description (notes and source excluded), for cache keys."""
        data = self.to_dict()
        data.pop("notes", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def summary(self) -> str:
        p = self.parallelism
        return (f"{self.name} ({self.backend} {self.target}): {p.compute_units} units, warp {p.warp_size}, "
                f"{len(self.memory)} memory layers ({' > '.join(m.name for m in self.memory)})")


def _given(layer: MemoryLayer, *keys: str) -> list[tuple[str, Any]]:
    """The layer's optional fields among ``keys`` that are set, in that order (a description's YAML leaves the
    others out)."""
    return [(k, getattr(layer, k)) for k in keys if getattr(layer, k) is not None]
