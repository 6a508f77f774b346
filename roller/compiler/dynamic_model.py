"""Models whose inputs leave sizes open (an ONNX ``dim_param`` such as ``batch`` or ``sequence``, or an unknown
dimension): ``roller.compile_model`` returns a ``DynamicModel``, which runs at every size.

With one open size and every operator shape-generic in it (``roller.compiler.model_family``: a batch through a CNN, a
sequence length through a BERT layer), the model is built once and a run at a new size compiles nothing
(``mode == "generic"``; "mixed" where some operators are built at each size's first run). Otherwise
(``mode == "per-size"``, ``why`` says why: two open sizes, say) each distinct set of sizes is imported, fused,
planned and built on its first run, and kept, the kernels coming from the kernel cache where an operator was
built before.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roller.compiler.check import compare_outputs, model_tolerances
from roller.compiler.model_reference import ModelReference, graph_reference, onnxruntime_reference
from roller.compiler.target import Target, TargetBound
from roller.errors import InputError, printable
from roller.ir.symbolic import DEFAULT_MAX, MAX_SYMBOL_VALUE
from roller.ir.tensor_expr import TensorExpr


def open_dims(proto: Any, shapes: Mapping[str, Any] | None) -> dict[str, dict[int, str]]:
    """Input -> {dimension: symbol} for every input dimension the model leaves open and ``shapes`` does not
    fix: its ``dim_param`` (the same name in two inputs is one size), or ``<input>_<dimension>`` when it has
    none."""
    out: dict[str, dict[int, str]] = {}
    inits = {i.name for i in proto.graph.initializer}
    for inp in proto.graph.input:
        if inp.name in inits or (shapes and inp.name in shapes) or not inp.type.HasField("tensor_type"):
            continue
        t = inp.type.tensor_type
        if not t.HasField("shape"):
            continue  # the importer's own error asks for --shape: a rank is needed too
        for i, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            name = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{inp.name}_{i}"
            out.setdefault(inp.name, {})[i] = name
    return out


@dataclass
class DynamicModel(TargetBound):
    """A model with open sizes: ``run`` / call it at any sizes within ``ranges``; ``model_at`` is the compiled
    ``roller.compiler.model.Model`` for one set of sizes."""

    source: Any  # onnx.ModelProto
    target: Target
    dims: dict[str, dict[int, str]]  # input -> {dimension: symbol}
    ranges: dict[str, tuple[int, int]]
    options: dict[str, Any] = field(default_factory=dict)  # compile_model's other options
    generic: Any = None  # roller.compiler.model_family.GenericModel where one build serves every size
    why: str = ""  # why not, where it does not
    _models: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)
    compile_s: dict[tuple[int, ...], float] = field(default_factory=dict)  # seconds each size set took
    # a size's first runs from several threads build it once
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def name(self) -> str:
        return printable(str(self.source.graph.name or "model"))

    @property
    def mode(self) -> str:
        """"generic": one build serves every size; "mixed": so do most operators' kernels, the others are built
        at each size's first run (``why`` names one); "per-size": the whole model is built for each size."""
        if self.generic is None:
            return "per-size"
        return "mixed" if self.generic.exact else "generic"

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(self.ranges)

    @property
    def input_names(self) -> list[str]:
        inits = {i.name for i in self.source.graph.initializer}
        return [i.name for i in self.source.graph.input if i.name not in inits]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.source.graph.output]

    @property
    def models(self) -> dict[tuple[int, ...], Any]:
        """The compiled models so far, by sizes (in ``symbols`` order)."""
        return dict(self._models)

    def __repr__(self) -> str:
        ranges = ", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in self.ranges.items())
        what = "one build for every size" if self.generic is not None else f"{len(self._models)} sizes built"
        return f"<roller.DynamicModel {self.name} on {self.hw.name}/{self.backend.name}: {ranges}; {what}>"

    def bind(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        """The sizes of a run's inputs, checked: one value per symbol, each within its range."""
        values: dict[str, int] = {}
        for name, by_dim in self.dims.items():
            if name not in feeds:
                continue
            shape = np.shape(feeds[name])
            for i, sym in by_dim.items():
                if i >= len(shape):
                    raise InputError(f"{self.name}: input {name!r} has rank {len(shape)}; the model's has more "
                                     f"than {i} dimensions")
                v = int(shape[i])
                if values.setdefault(sym, v) != v:
                    raise InputError(f"{self.name}: size {sym!r} is {values[sym]} in one input and {v} in "
                                     f"{name!r}")
        for sym, (lo, hi) in self.ranges.items():
            if sym not in values:
                raise InputError(f"{self.name}: no input gives size {sym!r}")
            if not lo <= values[sym] <= hi:
                raise InputError(f"{self.name}: size {sym!r} = {values[sym]} is outside its range [{lo}, {hi}] "
                                 "(compile_model(..., ranges={...}) sets it)", field=f"ranges.{sym}")
        return values

    def shapes(self, values: Mapping[str, int]) -> dict[str, list[int]]:
        """Every open input's shape at these sizes."""
        out = {}
        for inp in self.source.graph.input:
            if inp.name not in self.dims:
                continue
            dims = inp.type.tensor_type.shape.dim
            out[inp.name] = [values[self.dims[inp.name][i]] if i in self.dims[inp.name] else int(d.dim_value)
                             for i, d in enumerate(dims)]
        return out

    def model_at(self, **values: int) -> Any:
        """The compiled model at these sizes (built on first use, then kept)."""

        key = tuple(int(values[s]) for s in self.symbols) if all(s in values for s in self.symbols) else None
        if key is None:
            missing = [s for s in self.symbols if s not in values]
            raise InputError(f"{self.name}: no value for size {missing[0]!r} (sizes: {', '.join(self.symbols)})")
        with self._lock:
            if key not in self._models:
                t = time.perf_counter()
                model = static_model(self.source, self.target, self.shapes(dict(zip(self.symbols, key))),
                                     **self.options)
                self.compile_s[key] = time.perf_counter() - t
                self._models[key] = model
            return self._models[key]

    def _feeds(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        names = self.input_names
        if len(args) > len(names):
            raise InputError(f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        feeds = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given twice")
            feeds[k] = v
        return feeds

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by name, for inputs by name, at whatever sizes the inputs have."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"run() takes a dict of inputs by name ({', '.join(self.input_names)}); "
                             f"got {type(inputs).__name__}")
        values = self.bind(inputs)
        if self.generic is not None:
            return dict(self.generic.run(self._checked(inputs), values[self.symbols[0]]))
        return dict(self.model_at(**values).run(inputs))

    def _checked(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in inputs]
        extra = [n for n in inputs if n not in self.input_names]
        if missing or extra:
            what = f"missing {', '.join(missing)}" if missing else f"unknown input {', '.join(extra)}"
            raise InputError(f"{what}; the model takes {', '.join(self.input_names)}")
        return dict(inputs)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        out = self.run(self._feeds(args, kwargs))
        values = tuple(out[n] for n in self.output_names)
        return values[0] if len(values) == 1 else values

    def check(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """A run's outputs at the inputs' sizes against onnxruntime on the model (or, without it, the graph at
        those sizes evaluated operator by operator); ``Model.check``'s tolerance."""
        if self.generic is None:
            return dict(self.model_at(**self.bind(inputs)).check(inputs))
        got = self.run(inputs)
        graph = self.generic.family.at(self.bind(inputs)[self.symbols[0]])   # the model at the inputs' sizes
        given = onnxruntime_reference(self.source, dict(inputs))
        ref = given if isinstance(given, ModelReference) else graph_reference(graph, inputs, given)
        return compare_outputs(f"{self.name} on {self.hw.name}/{self.backend.name}", self.output_names, got,
                               ref.outputs, ref.by, model_tolerances(v.dtype for v in graph.values.values()),
                               ref.spread, ref.spread_by)

    def benchmark(self, inputs: Mapping[str, Any], repeat: int = 10, warmup: int = 2) -> float:
        """Median seconds of one run's device work at the inputs' sizes."""
        import statistics

        if self.generic is not None:
            v = self.bind(inputs)[self.symbols[0]]
            return float(statistics.median(self.generic.time(self._checked(inputs), v, repeat=repeat,
                                                             warmup=warmup)))
        return float(self.model_at(**self.bind(inputs)).benchmark(repeat=repeat, warmup=warmup, inputs=inputs))


def static_model(proto: Any, target: Target, shapes: Mapping[str, Any], *, top_k: int = 10,
                 evaluate: bool = False, cache: bool = True, jobs: int | None = None, progress: bool | None = None,
                 fuse: str = "solver") -> Any:
    """``proto`` with its open sizes fixed by ``shapes``, imported and built (a ``roller.compiler.model.Model``,
    checked against onnxruntime on the model with those shapes)."""
    from roller.compiler.model import build_model, with_shapes
    from roller.frontends.onnx import import_model

    graph = import_model(proto, shapes)
    return build_model(graph, target, method=fuse, top_k=top_k, evaluate=evaluate, cache=cache, jobs=jobs,
                       progress=progress, source=with_shapes(proto, shapes) if shapes else proto)


def dynamic_model(proto: Any, target: Target, dims: dict[str, dict[int, str]],
                  ranges: Mapping[str, Any] | None, options: dict[str, Any], generic: bool = True) -> DynamicModel:
    """A DynamicModel of ``proto``, with each open size's range from ``ranges`` (default [1, DEFAULT_MAX]); with
    ``generic``, built once for every size where that serves."""
    symbols = list(dict.fromkeys(s for by_dim in dims.values() for s in by_dim.values()))
    given = dict(ranges or {})
    unknown = set(given) - set(symbols)
    if unknown:
        raise InputError(f"ranges names no open size of the model: {', '.join(sorted(unknown))} (open sizes: "
                         f"{', '.join(symbols)})", field="ranges")
    out: dict[str, tuple[int, int]] = {}
    for s in symbols:
        r = given.get(s, (1, DEFAULT_MAX))
        ok = isinstance(r, (tuple, list)) and len(r) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in r)
        if not ok or not 1 <= r[0] <= r[1] <= MAX_SYMBOL_VALUE:
            raise InputError(f"expected (least, greatest) with 1 <= least <= greatest <= "
                             f"{MAX_SYMBOL_VALUE}, got {r!r}", field=f"ranges.{s}")
        out[s] = (int(r[0]), int(r[1]))
    model = DynamicModel(proto, target, dims, out, options)
    if generic:
        found = _generic(model)
        if isinstance(found, str):
            model.why = found
        else:
            model.generic = found
            model.why = next((why for _, why in found.exact.values()), "")
    else:
        model.why = "compile_model(..., generic=False)"
    return model


class _Diverged(Exception):
    """Fusion at a second size asked for the cost of another operator than at the first."""


def _generic(model: DynamicModel) -> Any:
    """The model's GenericModel, or why one build cannot serve every size."""
    from roller.compiler.model import fuse_stage
    from roller.compiler.model_family import generic_model, graph_family
    from roller.construction.layout import choose_layout, packed_variants
    from roller.frontends.onnx import import_model
    from roller.graph.passes import pack_constants
    from roller.ir.layout import PackedLayout

    if len(model.symbols) != 1:
        return f"{len(model.symbols)} sizes are open; one build serves one"
    if not model.backend.can_run_here():
        return f"no {model.backend.name} device here to run it on"
    sym = model.symbols[0]
    lo, hi = model.ranges[sym]
    other = max(lo, hi // 2)
    if other == hi:
        other = lo
    if other == hi:
        return f"{sym} takes one value"
    # Fusion costs its candidates at the size it fuses, and decides otherwise at another (ResNet-18's solver put
    # a residual add into the other convolution at half the batch): the second size's fusion is given the
    # greatest one's costs, candidate by candidate in the order asked, so that it makes the same decisions.
    predict = model.target.predicted_seconds
    costs: list[tuple[str, float]] = []

    def record(expr: TensorExpr) -> float:
        costs.append((expr.statement(), predict(expr)))
        return costs[-1][1]

    def replay(expr: TensorExpr) -> float:
        if not costs or costs[0][0] != expr.statement():
            raise _Diverged
        return costs.pop(0)[1]

    # Weight layouts likewise: the second size takes the layout chosen at the greatest, operator by operator.
    layouts: list[tuple[str, tuple[int, ...], int, int] | None] = []

    def choose(expr: TensorExpr, constants: tuple[str, ...]) -> PackedLayout | None:
        p = choose_layout(expr, model.hw, constants, model.target.matrix_support, best=model.target.best)
        layouts.append(None if p is None else (p.tensor, p.perm, p.split, p.block))
        return p

    def chosen(expr: TensorExpr, constants: tuple[str, ...]) -> PackedLayout | None:
        if not layouts:
            raise _Diverged
        want = layouts.pop(0)
        if want is None:
            return None
        found = [p for p in packed_variants(expr, constants, block=want[3])
                 if (p.tensor, p.perm, p.split, p.block) == want]
        if not found:
            raise _Diverged
        return found[0]

    graphs = []
    for v, seconds, layout in ((hi, record, choose), (other, replay, chosen)):
        try:
            g = import_model(model.source, model.shapes({sym: v}))
            g, _ = fuse_stage(g, model.target, model.options.get("fuse", "solver"), seconds)
            g = g.copy()
            pack_constants(g, layout)
        except InputError as err:
            return f"at {sym}={v}: {err}"
        except _Diverged:
            return "fusion or a weight layout asks for other operators at another size"
        graphs.append(g)
    family = graph_family(graphs[0], graphs[1], sym, lo, hi, other)
    if isinstance(family, str):
        return family
    return generic_model(family, model.target, evaluate=bool(model.options.get("evaluate", False)))
