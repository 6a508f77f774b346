"""The execution plan of a graph: device buffers, which value lives in which, and the launches in order.

Constants, inputs and outputs get buffers of their own; intermediates share a pool, reused by lifetime: a
value's buffer returns to the pool after the last step that reads it (or any view of it), and a new value
takes the smallest free buffer that holds it (or a new one). Views never get memory. Kernels that read
padded copies of an input (``launch.json``'s ``pad``, a CPU's windows) read it from a buffer of its own, filled
with the pad value once and copied into at each run; one such buffer serves every step with the same padded
shape, padding and value, since each copy writes only the interior. A value held with a border
(``roller.graph.padding``: its producer writes the interior of the padded buffer its readers want) needs no
copy: its buffer is filled once and passes, by lifetime, only to values with the same border. The plan is plain data
(``to_json``, ``plan_from_json``): the executor (``roller.runtime.executor``) runs it, and a backend's launcher
can replay it from ``roller build``'s ``plan.json``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roller.dtypes import dtype as dtype_of
from roller.graph.ir import Border, CopyNode, Graph, OpNode, Piece, ViewNode
from roller.graph.passes import alias_root, kernel_key
from roller.program import pad_value_json


@dataclass(frozen=True)
class Buffer:
    id: int
    nbytes: int
    role: str  # constant | input | output | intermediate | padded
    values: tuple[str, ...]  # the values (roots) that live in it over the run
    fill: float | None = None  # padded: the value it holds around the copies (written once, before the runs)


@dataclass(frozen=True)
class Rect:
    """One strided copy of bytes: ``region`` = (bytes per row, rows, slices); pitches in bytes."""

    src_offset: int
    dst_offset: int
    region: tuple[int, int, int]
    src_pitches: tuple[int, int]
    dst_pitches: tuple[int, int]


@dataclass(frozen=True)
class KernelStep:
    kernel: str  # kernel key
    args: tuple[int, ...]  # buffer ids: inputs in order, then the output
    node: str


@dataclass(frozen=True)
class CopyStep:
    src: int
    dst: int
    rects: tuple[Rect, ...]
    node: str


@dataclass(frozen=True)
class InputPad:
    """A kernel input read from a padded copy: the padded shape, padding (before, after) per dimension, the
    value around the tensor, and the element type."""

    shape: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    value: float
    dtype: str

    @staticmethod
    def from_launch(launch: dict[str, Any]) -> tuple[InputPad | None, ...]:
        """Per input of a ``launch.json``, its padding, or None for an input read as it is."""
        out: list[InputPad | None] = []
        for a in launch["arguments"]:
            if a["role"] != "input":
                continue
            p = a.get("pad")
            out.append(None if p is None else InputPad(
                tuple(a["shape"]), tuple(zip(p["before"], p["after"])), float(p["value"]),
                a.get("dtype", "float32")))
        return tuple(out)


@dataclass
class Plan:
    buffers: list[Buffer]
    steps: list[KernelStep | CopyStep]
    value_buffer: dict[str, int]  # every value (views included) -> its buffer
    inputs: list[str]
    outputs: list[str]
    kernels: dict[str, str] = field(default_factory=dict)  # kernel key -> kernel name
    pads: dict[int, InputPad] = field(default_factory=dict)  # padded buffer -> its padding
    input_pads: dict[str, InputPad] = field(default_factory=dict)  # input uploaded into a padded buffer's interior

    def bytes_by_role(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.buffers:
            out[b.role] = out.get(b.role, 0) + b.nbytes
        return out

    @property
    def peak_bytes(self) -> int:
        """Device memory the plan holds at once: every buffer is allocated for the whole run."""
        return sum(b.nbytes for b in self.buffers)

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [{"value": v, "buffer": self.value_buffer[v],
                        **({"pad": {"shape": list(self.input_pads[v].shape),
                                    "before": [b for b, _ in self.input_pads[v].pads],
                                    "after": [a for _, a in self.input_pads[v].pads],
                                    "value": pad_value_json(self.input_pads[v].value),
                                    "dtype": self.input_pads[v].dtype}}
                           if v in self.input_pads else {})} for v in self.inputs],
            "outputs": [{"value": v, "buffer": self.value_buffer[v]} for v in self.outputs],
            "buffers": [{"id": b.id, "bytes": b.nbytes, "role": b.role, "values": list(b.values),
                         **({"fill": pad_value_json(b.fill), "dtype": self.pads[b.id].dtype,
                             "shape": list(self.pads[b.id].shape),
                             "before": [x for x, _ in self.pads[b.id].pads],
                             "after": [x for _, x in self.pads[b.id].pads]} if b.fill is not None else {})}
                        for b in self.buffers],
            "steps": [{"kind": "kernel", "kernel": self.kernels.get(s.kernel, s.kernel), "args": list(s.args),
                       "node": s.node} if isinstance(s, KernelStep) else
                      {"kind": "copy", "src": s.src, "dst": s.dst, "node": s.node,
                       "rects": [{"src_offset": r.src_offset, "dst_offset": r.dst_offset, "region": list(r.region),
                                  "src_pitches": list(r.src_pitches), "dst_pitches": list(r.dst_pitches)}
                                 for r in s.rects]}
                      for s in self.steps],
            "peak_bytes": self.peak_bytes,
            "bytes_by_role": self.bytes_by_role(),
        }


def plan_from_json(doc: Mapping[str, Any]) -> Plan:
    """The plan ``Plan.to_json`` wrote (``roller build``'s ``plan.json``): kernels by the names the document
    gives them. KeyError, TypeError or ValueError for a document that is not one."""
    def pad(d: Mapping[str, Any]) -> InputPad:
        return InputPad(tuple(int(x) for x in d["shape"]),
                        tuple((int(b), int(a)) for b, a in zip(d["before"], d["after"], strict=True)),
                        float(d["value"] if "value" in d else d["fill"]), str(d["dtype"]))

    buffers = [Buffer(int(b["id"]), int(b["bytes"]), str(b["role"]), tuple(str(v) for v in b["values"]),
                      None if b.get("fill") is None else float(b["fill"])) for b in doc["buffers"]]
    if [b.id for b in buffers] != list(range(len(buffers))):
        raise ValueError("buffers are not numbered 0, 1, ... in order")
    value_buffer = {v: b.id for b in buffers for v in b.values}
    for entry in (*doc["inputs"], *doc["outputs"]):
        value_buffer[str(entry["value"])] = int(entry["buffer"])
    steps: list[KernelStep | CopyStep] = []
    for s in doc["steps"]:
        if s["kind"] == "kernel":
            steps.append(KernelStep(str(s["kernel"]), tuple(int(a) for a in s["args"]), str(s["node"])))
        elif s["kind"] == "copy":
            rects = tuple(Rect(int(r["src_offset"]), int(r["dst_offset"]), _triple(r["region"]),
                               _pair(r["src_pitches"]), _pair(r["dst_pitches"])) for r in s["rects"])
            steps.append(CopyStep(int(s["src"]), int(s["dst"]), rects, str(s["node"])))
        else:
            raise ValueError(f"a step of kind {s['kind']!r}")
    if any(a < 0 or a >= len(buffers) for s in steps for a in (s.args if isinstance(s, KernelStep)
                                                                 else (s.src, s.dst))):
        raise ValueError("a step names a buffer the plan does not have")
    kernels = {str(s.kernel): str(s.kernel) for s in steps if isinstance(s, KernelStep)}
    return Plan(buffers, steps, value_buffer, [str(e["value"]) for e in doc["inputs"]],
                [str(e["value"]) for e in doc["outputs"]], kernels,
                pads={b.id: pad(d) for b, d in zip(buffers, doc["buffers"]) if b.fill is not None},
                input_pads={str(e["value"]): pad(e["pad"]) for e in doc["inputs"] if "pad" in e})


def _pair(x: Any) -> tuple[int, int]:
    a, b = x
    return int(a), int(b)


def _triple(x: Any) -> tuple[int, int, int]:
    a, b, c = x
    return int(a), int(b), int(c)


def plan(graph: Graph, pads: Mapping[str, tuple[InputPad | None, ...]] | None = None,
         padded_inputs: bool = False) -> Plan:
    """The plan of ``graph``; ``pads``: per kernel key, how its kernel reads each input (``InputPad``). With
    ``padded_inputs``, a graph input that every reader reads with the same padding is uploaded into the
    interior of its padded buffer (``Plan.input_pads``) rather than copied there before each reader."""
    pads = pads or {}
    held = _padded_inputs(graph, pads) if padded_inputs else {}
    root = alias_root(graph)
    last_use: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for r in n.reads:
            last_use[root[r]] = i
    pinned = {root[v] for v in graph.outputs}
    buffers: list[Buffer] = []
    value_buffer: dict[str, int] = {}
    holders: dict[int, list[str]] = {}

    def new(nbytes: int, role: str, value: str, fill: float | None = None) -> int:
        bid = len(buffers)
        buffers.append(Buffer(bid, nbytes, role, (), fill))
        holders[bid] = [value]
        return bid

    for v in graph.constants:
        value_buffer[v] = new(graph.values[v].nbytes, "constant", v)
    bordered: dict[int, InputPad] = {}
    for v in graph.inputs:
        if v in held:
            size = math.prod(held[v].shape) * dtype_of(held[v].dtype).itemsize
            value_buffer[v] = new(size, "input", v, held[v].value)
            bordered[value_buffer[v]] = held[v]
        else:
            value_buffer[v] = new(graph.values[v].nbytes, "input", v)
    free: list[int] = []   # pool buffers not in use
    live_until: dict[int, int] = {}
    steps: list[KernelStep | CopyStep] = []
    padded: dict[tuple[InputPad, int], int] = {}  # (padding, which of the step's padded inputs) -> buffer

    def padded_copy(value: str, pad: InputPad, nth: int, node: str) -> int:
        key = (pad, nth)
        if key not in padded:
            padded[key] = new(math.prod(pad.shape) * dtype_of(pad.dtype).itemsize, "padded", value, pad.value)
        else:
            holders[padded[key]].append(value)
        src = graph.values[value]
        piece = Piece(value, (0,) * len(src.shape), tuple(b for b, _ in pad.pads), src.shape)
        steps.append(CopyStep(value_buffer[value], padded[key],
                              rects(src.shape, pad.shape, piece, dtype_of(pad.dtype).itemsize), node))
        return padded[key]

    def bordered_buffer(value: str, border: Border) -> int:
        # A value held inside a border (roller.graph.padding): the step that makes it writes only the interior,
        # so its buffer holds the fill around it from the start and passes only to values with the same border.
        v = graph.values[value]
        pad = InputPad(v.shape, border.pads, border.fill, v.dtype)
        for b in free:
            if bordered.get(b) == pad:
                free.remove(b)
                holders[b].append(value)
                return b
        bid = new(v.nbytes, "padded", value, border.fill)
        bordered[bid] = pad
        return bid

    for i, n in enumerate(graph.nodes):
        out = n.output
        if isinstance(n, ViewNode):
            value_buffer[out] = value_buffer[n.input]
            continue
        nbytes = graph.values[out].nbytes
        border = graph.values[out].border
        if out in pinned:
            bid = new(nbytes, "output", out)
        elif border is not None:
            bid = bordered_buffer(out, border)
            live_until[bid] = last_use.get(out, i)
        else:
            fits = [b for b in free if buffers[b].nbytes >= nbytes and b not in bordered]
            if fits:
                bid = min(fits, key=lambda b: (buffers[b].nbytes, b))
                free.remove(bid)
                holders[bid].append(out)
            else:
                bid = new(nbytes, "intermediate", out)
            live_until[bid] = last_use.get(out, i)
        value_buffer[out] = bid
        if isinstance(n, OpNode):
            key = kernel_key(n)
            how = pads.get(key) or (None,) * len(n.inputs)
            args, nth = [], 0
            for v, pad in zip(n.inputs, how):
                if pad is None or held.get(v) == pad:
                    args.append(value_buffer[v])
                else:
                    args.append(padded_copy(v, pad, nth, n.name))
                    nth += 1
            steps.append(KernelStep(key, tuple(args) + (bid,), n.name))
        elif isinstance(n, CopyNode):
            for src, boxes in _copies(graph, n):
                steps.append(CopyStep(value_buffer[src], bid, boxes, n.name))
        # Release pool buffers whose last reader was this step (after the step: it still reads them).
        for b, until in list(live_until.items()):
            if until <= i:
                del live_until[b]
                free.append(b)
    for v in graph.outputs:
        if v not in value_buffer:   # an output that is an input or a constant (or a view of one)
            value_buffer[v] = value_buffer[root[v]] if root[v] in value_buffer else value_buffer[v]
    buffers = [Buffer(b.id, b.nbytes, b.role, tuple(holders[b.id]), b.fill) for b in buffers]
    return Plan(buffers, steps, value_buffer, list(graph.inputs), list(graph.outputs),
                pads={**{b: pad for (pad, _), b in padded.items()}, **bordered}, input_pads=held)


def _padded_inputs(graph: Graph, pads: Mapping[str, tuple[InputPad | None, ...]]) -> dict[str, InputPad]:
    """Graph inputs that only operators read, each with the same padding: input -> that padding."""
    wanted: dict[str, set[InputPad | None]] = {v: set() for v in graph.inputs if v not in graph.outputs}
    for n in graph.nodes:
        for i, v in enumerate(n.reads):
            if v not in wanted:
                continue
            how = pads.get(kernel_key(n)) if isinstance(n, OpNode) else None
            wanted[v].add(how[i] if how is not None else None)
    return {v: next(iter(w)) for v, w in wanted.items() if len(w) == 1 and None not in w}  # type: ignore[misc]


def _copies(graph: Graph, node: CopyNode) -> list[tuple[str, tuple[Rect, ...]]]:
    out_v = graph.values[node.output]
    return [(p.source, rects(graph.values[p.source].shape, out_v.shape, p, dtype_of(out_v.dtype).itemsize))
            for p in node.pieces]


def rects(src_shape: tuple[int, ...], dst_shape: tuple[int, ...], piece: Piece, itemsize: int) -> tuple[Rect, ...]:
    """The strided copies (each at most three dimensions) that move ``piece`` between row-major arrays."""
    def strides(shape: tuple[int, ...]) -> list[int]:
        s, acc = [], 1
        for d in reversed(shape):
            s.append(acc)
            acc *= d
        return s[::-1]

    ss, ds = strides(src_shape), strides(dst_shape)
    # (count, src stride, dst stride) per dimension, innermost last; dims of one element vanish, and a dim
    # merges into the next inner one when both arrays are contiguous across it.
    dims = [[piece.shape[d], ss[d], ds[d]] for d in range(len(piece.shape)) if piece.shape[d] != 1]
    merged: list[list[int]] = []
    for count, s_st, d_st in dims:
        if merged and merged[-1][1] == s_st * count and merged[-1][2] == d_st * count:
            merged[-1] = [merged[-1][0] * count, s_st, d_st]
        else:
            merged.append([count, s_st, d_st])
    if not merged or merged[-1][1] != 1 or merged[-1][2] != 1:
        merged.append([1, 1, 1])
    src0 = sum(a * s for a, s in zip(piece.src_start, ss))
    dst0 = sum(a * s for a, s in zip(piece.dst_start, ds))
    inner = merged[-3:] if len(merged) >= 3 else [[1, 0, 0]] * (3 - len(merged)) + merged
    outer = merged[:-3] if len(merged) > 3 else []
    (n2, s2, d2), (n1, s1, d1), (n0, _, _) = inner
    out = []
    for index in _points([c for c, _, _ in outer]):
        so = src0 + sum(i * s for i, (_, s, _) in zip(index, outer))
        do = dst0 + sum(i * d for i, (_, _, d) in zip(index, outer))
        out.append(Rect(so * itemsize, do * itemsize, (n0 * itemsize, n1, n2),
                        (s1 * itemsize, s2 * itemsize), (d1 * itemsize, d2 * itemsize)))
    return tuple(out)


def _points(counts: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for c in counts:
        out = [p + (i,) for p in out for i in range(c)]
    return out


def rect_elements(r: Rect, itemsize: int) -> int:
    return r.region[0] // itemsize * r.region[1] * r.region[2]


def piece_elements(p: Piece) -> int:
    return math.prod(p.shape)
