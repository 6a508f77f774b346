"""TensorExpr: one operator as axes, tensors with affine accesses, and a body.

The construction engine sees an operator only through the queries here: which axes exist and how long they
are, and for a tile over all axes, the region of every tensor it touches and the work it does.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from roller.dtypes import DTYPES, OP_DTYPES
from roller.ir.expr import Affine, Expr, Read, flop_count, map_reads, reads

DTYPE_BYTES = {name: DTYPES[name].itemsize for name in OP_DTYPES}
REDUCE_OPS = {"+=": "sum", "max=": "max", "min=": "min", "=": None}
ASSIGN_OF = {v: k for k, v in REDUCE_OPS.items()}


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    reduce: bool = False


@dataclass(frozen=True)
class View:
    """A tensor read through a re-indexing (the implicit-GEMM im2col view, or an axis fusion).

    Virtual dimension d enumerates the sub-axes ``dims[d]`` in mixed radix (outermost first); the element
    fetched is ``source[index(sub-axes)]``, and a source index outside ``source_shape`` yields the pad value.
    """

    source_shape: tuple[int, ...]
    dims: tuple[tuple[tuple[str, int], ...], ...]
    index: tuple[Affine, ...]

    def is_reshape(self) -> bool:
        """True when the view is a plain reshape of a row-major source (no gather, no padding)."""
        flat = [ax for d in self.dims for ax in d]
        if len(flat) != len(self.index):
            return False
        return all(idx.plain_axis() == ax and self.source_shape[i] == ext
                   for i, ((ax, ext), idx) in enumerate(zip(flat, self.index)))


@dataclass(frozen=True)
class Preparation:
    """How construction's form of an op was derived from the op as written (``roller.ir.fuse``): inputs read
    from padded copies first (``pads``: per input, (before, after) per dimension of the tensor as written, so
    that no read leaves it), then the axis groups fused, by a plain reshape of every tensor (``fuse``) or
    through views that gather (``regroup``, the implicit GEMM of a convolution), or none (``none``)."""

    kind: str  # "fuse" | "regroup" | "none"
    groups: tuple[tuple[str, ...], ...]
    pads: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"kind": self.kind, "groups": [list(g) for g in self.groups]}
        if self.pads:
            doc["pads"] = {t: [list(p) for p in dims] for t, dims in self.pads}
        return doc

    @staticmethod
    def from_json(doc: object) -> Preparation | None:
        """The recorded preparation; None for ``null``; ValueError for anything else malformed."""
        if doc is None:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or \
                not isinstance(doc.get("groups"), list) or \
                not all(isinstance(g, list) and all(isinstance(a, str) for a in g) for g in doc["groups"]):
            raise ValueError(f"bad preparation record {doc!r}")
        pads = doc.get("pads", {})
        if not isinstance(pads, dict) or not all(
                isinstance(dims, list) and all(isinstance(p, list) and len(p) == 2 and
                                               all(isinstance(x, int) and x >= 0 for x in p) for p in dims)
                for dims in pads.values()):
            raise ValueError(f"bad pads in preparation record {doc!r}")
        return Preparation(doc["kind"], tuple(tuple(g) for g in doc["groups"]),
                           tuple((str(t), tuple((int(p[0]), int(p[1])) for p in dims)) for t, dims in pads.items()))

    def with_pads(self, pads: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]) -> Preparation:
        return Preparation(self.kind, self.groups, pads)


@dataclass(frozen=True)
class Stage:
    """A per-row value a row kernel computes before its body (softmax's maximum and sum, layer norm's mean and
    variance): ``name[index] reduce_op= body`` over the expression's axes, where ``index`` names the row axes
    and every other axis of the expression is reduced. Later stages and the body read it as ``name[index]``."""

    name: str
    reduce_op: str  # "sum" | "max" | "min"
    index: tuple[Affine, ...]
    body: Expr

    def statement(self) -> str:
        return f"{self.name}[{','.join(str(i) for i in self.index)}] {ASSIGN_OF[self.reduce_op]} {self.body}"


@dataclass(frozen=True)
class TensorDecl:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    view: View | None = None
    orig_shape: tuple[int, ...] | None = None  # set when axis fusion reshaped the tensor (same memory)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """Shape of the buffer the user passes (the source of a view)."""
        if self.view is not None:
            return self.view.source_shape
        return self.orig_shape or self.shape


@dataclass(frozen=True)
class TensorExpr:
    name: str
    kind: str
    output: TensorDecl
    out_index: tuple[Affine, ...]
    inputs: tuple[TensorDecl, ...]
    axes: tuple[Axis, ...]
    reduce_op: str | None
    body: Expr
    pad_value: float = 0.0
    acc_dtype: str = "float32"
    params: tuple[tuple[str, object], ...] = ()
    source: TensorExpr | None = field(default=None, compare=False)
    # A fused epilogue (bias, activation, residual add...) applied to each reduced value before it is stored:
    # reads of the output at ``out_index`` stand for that value; other reads index output axes only and name
    # inputs the body does not read (``epilogue_inputs``), so kernels read them once per output point.
    epilogue: Expr | None = None
    # A row kernel's stages (an elementwise body that reads per-row reductions of its inputs, all in one kernel:
    # each thread owns rows and walks their columns once per stage); () for every other operator.
    stages: tuple[Stage, ...] = ()
    preparation: Preparation | None = field(default=None, compare=False)  # how ``source`` became this form

    @property
    def typed(self) -> bool:
        """Whether the op computes with integer or bool values (``roller.ir.types``): it reads or writes such a
        tensor, or calls a typed function. Only a backend that renders typed bodies builds it."""
        from roller.ir.types import typed_body

        if DTYPES[self.output.dtype].integral:
            return True
        tensors = {t.name: t.dtype for t in self.tensors}
        return typed_body(self.body, tensors) or (self.epilogue is not None and typed_body(self.epilogue, tensors)) \
            or any(typed_body(st.body, tensors) for st in self.stages)

    # ---- axes -------------------------------------------------------------------------------------
    @property
    def spatial_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if not a.reduce)

    @property
    def reduce_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.reduce)

    @property
    def extents(self) -> dict[str, int]:
        return {a.name: a.extent for a in self.axes}

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    # ---- tensors ----------------------------------------------------------------------------------
    @property
    def tensors(self) -> tuple[TensorDecl, ...]:
        return self.inputs + (self.output,)

    def tensor(self, name: str) -> TensorDecl:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def accesses(self, name: str) -> list[tuple[Affine, ...]]:
        """Distinct index tuples with which a tensor is read (or written, for the output)."""
        if name == self.output.name:
            return [self.out_index]
        out: list[tuple[Affine, ...]] = []
        for r in self.input_reads():
            if r.tensor == name and r.index not in out:
                out.append(r.index)
        return out

    def input_reads(self) -> list[Read]:
        """Every read of an input: in the stages, the body and the epilogue."""
        epi = [r for r in reads(self.epilogue) if r.tensor != self.output.name] if self.epilogue is not None else []
        names = {st.name for st in self.stages}
        staged = [r for st in self.stages for r in reads(st.body) if r.tensor not in names]
        return staged + [r for r in reads(self.body) if r.tensor not in names] + epi

    @property
    def row_axes(self) -> tuple[str, ...]:
        """A row kernel's row axes (its stages' index), in axis order; () for other operators."""
        if not self.stages:
            return ()
        used = {i.plain_axis() for i in self.stages[0].index}
        return tuple(a.name for a in self.axes if a.name in used)

    @property
    def body_inputs(self) -> tuple[TensorDecl, ...]:
        """The inputs the body (and the stages) read: what a reduction step stages; the rest are
        ``epilogue_inputs``."""
        used = {r.tensor for r in reads(self.body)} | {r.tensor for st in self.stages for r in reads(st.body)}
        return tuple(t for t in self.inputs if t.name in used)

    @property
    def epilogue_inputs(self) -> tuple[TensorDecl, ...]:
        used = {t.name for t in self.body_inputs}
        return tuple(t for t in self.inputs if t.name not in used)

    def remap_reads(self, fn: Callable[[Read], Expr], out_index: tuple[Affine, ...] | None = None) -> TensorExpr:
        """The body and epilogue with every input read replaced by ``fn(read)``; the epilogue's reads of the
        reduced value follow ``out_index`` (the output's new index, when a pass changed it)."""
        new_out = self.out_index if out_index is None else out_index
        out_name = self.output.name

        def epi(r: Read) -> Expr:
            return Read(out_name, new_out, r.pos) if r.tensor == out_name else fn(r)

        names = {st.name for st in self.stages}

        def inner(r: Read) -> Expr:
            return r if r.tensor in names else fn(r)

        return replace(self, body=map_reads(self.body, inner), out_index=new_out,
                       epilogue=None if self.epilogue is None else map_reads(self.epilogue, epi),
                       stages=tuple(replace(st, body=map_reads(st.body, inner)) for st in self.stages))

    def axes_of(self, name: str) -> tuple[str, ...]:
        """Axes a tensor's accesses depend on, in axis order."""
        used = {a for idx in self.accesses(name) for i in idx for a in i.axes()}
        return tuple(a.name for a in self.axes if a.name in used)

    # ---- region queries ---------------------------------------------------------------------------
    def region(self, name: str, tile: Mapping[str, int]) -> tuple[int, ...]:
        """Bounding box, per tensor dimension, of the elements a tile touches (exact for affine maps,
        strides and dilation included); clipped to the tensor's extent."""
        t = self.tensor(name)
        idxs = self.accesses(name)
        box: list[int] = []
        for d, size in enumerate(t.shape):
            lo = min(idx[d].span(tile)[0] for idx in idxs)
            hi = max(idx[d].span(tile)[1] for idx in idxs)
            box.append(min(hi - lo + 1, size))
        return tuple(box)

    def region_bytes(self, name: str, tile: Mapping[str, int]) -> int:
        t = self.tensor(name)
        return math.prod(self.region(name, tile)) * t.itemsize

    def output_region(self, tile: Mapping[str, int]) -> tuple[int, ...]:
        return self.region(self.output.name, tile)

    @property
    def flops_per_point(self) -> int:
        """Operations per point of the iteration space: the body plus one for the reduction."""
        return max(1, flop_count(self.body) + (1 if self.reduce_op else 0))

    def tile_flops(self, tile: Mapping[str, int]) -> int:
        return math.prod(tile[a.name] for a in self.axes) * self.flops_per_point

    @property
    def flops(self) -> int:
        epi = flop_count(self.epilogue) * math.prod(a.extent for a in self.spatial_axes) if self.epilogue else 0
        points = math.prod(a.extent for a in self.axes)
        return self.tile_flops(self.extents) + epi + sum(flop_count(st.body) + 1 for st in self.stages) * points

    @property
    def bytes(self) -> int:
        """Compulsory traffic: every input and the output once."""
        return sum(math.prod(t.storage_shape) * t.itemsize for t in self.tensors)

    @property
    def is_reduction(self) -> bool:
        return self.reduce_op is not None and bool(self.reduce_axes)

    # ---- printing, hashing ------------------------------------------------------------------------
    def statement(self) -> str:
        out = f"{self.output.name}[{','.join(str(i) for i in self.out_index)}]"
        main = "; ".join([st.statement() for st in self.stages] + [f"{out} {ASSIGN_OF[self.reduce_op]} {self.body}"])
        return main if self.epilogue is None else f"{main}; {out} = {self.epilogue}"

    def to_json(self) -> dict:
        """A generic op.json object that parses back to this expression (views are dropped: the
        unfused source is what the user wrote)."""
        src = self.source or self
        pad = src.pad_value
        doc: dict[str, object] = {
            "name": src.name,
            "expr": src.statement(),
            "shapes": {t.name: list(t.storage_shape) for t in src.tensors},
            "dtypes": {t.name: t.dtype for t in src.tensors},
            "pad_value": "-inf" if pad == float("-inf") else ("inf" if pad == float("inf") else pad),
        }
        # Axes that never index a dimension alone (a pooling window) cannot be inferred from the shapes.
        plain = {i.plain_axis() for r in src.input_reads() for i in r.index} | {i.plain_axis() for i in src.out_index}
        hidden = {a.name: a.extent for a in src.axes if a.name not in plain}
        if hidden:
            doc["extents"] = hidden
        return doc

    def __str__(self) -> str:
        return self.statement()

    def content_hash(self) -> str:
        """Stable across runs and machines: the semantic content, not object identity."""
        doc = {
            "expr": self.statement(),
            "tensors": [[t.name, list(t.shape), list(t.storage_shape), t.dtype, _view_doc(t.view)]
                        for t in self.tensors],
            "axes": [[a.name, a.extent, a.reduce] for a in self.axes],
            "pad": repr(self.pad_value),
            "acc": self.acc_dtype,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def with_name(self, name: str) -> TensorExpr:
        return replace(self, name=name)


def _view_doc(v: View | None) -> object:
    if v is None:
        return None
    return [list(v.source_shape), [[list(p) for p in d] for d in v.dims], [str(i) for i in v.index]]


def read_sites(expr: TensorExpr) -> list[Read]:
    return expr.input_reads()
