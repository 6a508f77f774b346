"""The compile pipeline: an op, a symbolic op or a model, and a target, to callable kernels and runnable models.

``compile``, ``compile_model``, ``construct`` and ``load`` are the public entry points (``roller.compile`` and
the others name them); each reads its input once (``roller.compiler.inputs``), resolves its ``Target`` once
(``roller.compiler.target``), and dispatches on the input's kind. The work is in the modules: ``kernel`` (one
op), ``kernel_set`` (an op with symbolic sizes), ``model`` (the model pipeline's stages and ``Model``),
``dynamic_model`` and ``model_family`` (models with open sizes), ``tune`` (top-K timed on the device),
``check`` (output checks), ``artifact`` (build folders written and read back), ``onnx_backend`` (the standard
ONNX backend interface). Imports are inside the functions so that ``import roller`` stays fast.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.errors import InputError

if TYPE_CHECKING:
    from roller.compiler.dynamic_model import DynamicModel
    from roller.compiler.kernel import Kernel
    from roller.compiler.kernel_set import GenericKernel
    from roller.compiler.model import Model
    from roller.compiler.target import HwLike, Target
    from roller.ir.opfile import OpLike
    from roller.program import RProgram


def check_top_k(top_k: object) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k


def construct(op: OpLike, hw: HwLike | Target, top_k: int = 10, backend: str | None = None) -> list[RProgram]:
    """The ``top_k`` rPrograms of ``op`` on ``hw``, best predicted first, for the backend that will render
    them (default: the description's): matrix-instruction programs only where that backend renders them."""
    from roller.compiler.kernel import source_op
    from roller.compiler.target import Target

    check_top_k(top_k)
    target = Target.resolve(hw, backend)
    return target.programs(source_op(op), top_k)


def compile(op: OpLike, hw: HwLike | Target | None = None, backend: str | None = None, top_k: int = 10,
            evaluate: bool = False, *, overrides: Mapping[str, Any] | None = None, cache: bool = True,
            repeat: int = 10, progress: bool | None = None) -> Kernel | GenericKernel:
    """Construct the top-K rPrograms of ``op`` on ``hw`` (None: this machine's own description, ``host``),
    render the best one (by the model, or by measurement on this machine with ``evaluate=True``) with
    ``backend`` (default: the description's), and return it as a callable Kernel. ``op``: an op.json dict, a
    path, or a TensorExpr (one op). An op with a symbolic size (``"M": "m"``) gives a
    ``roller.compiler.kernel_set.GenericKernel``, callable at every size in the symbol's range (with
    ``evaluate=True``, its kernels are chosen by timing the model's shortlist at sample sizes)."""
    from roller.compiler.inputs import OpInput, SymbolicInput, load_input
    from roller.compiler.kernel import build_kernel, source_op
    from roller.compiler.target import Target

    given = load_input(op)
    if isinstance(given, OpInput):
        if len(given.ops) != 1:
            raise InputError(f"expected one op, found {len(given.ops)} (choose one with --op NAME)",
                             source=given.source)
        src = source_op(given.ops[0])
    elif not isinstance(given, SymbolicInput):
        raise InputError("roller.compile builds an op; give a model to roller.compile_model, a build folder to "
                         "roller.load", source=str(op) if isinstance(op, (str, Path)) else None)
    target = Target.resolve(hw, backend, overrides)
    check_top_k(top_k)
    if isinstance(given, SymbolicInput):
        from roller.compiler.kernel_set import compile_generic

        return compile_generic(given.op, target, top_k=top_k, evaluate=evaluate, repeat=repeat, progress=progress)
    return build_kernel(src, target, top_k=top_k, evaluate=evaluate, use_cache=cache, repeat=repeat,
                        progress=progress)


def compile_model(model: Any, hw: HwLike | Target | None = None, backend: str | None = None, top_k: int = 10, *,
                  shapes: Mapping[str, Sequence[int]] | None = None, evaluate: bool = False, cache: bool = True,
                  jobs: int | None = None, progress: bool | None = None, fuse: bool | str = True,
                  ranges: Mapping[str, tuple[int, int]] | None = None, generic: bool = True,
                  example_inputs: Sequence[Any] | None = None) -> Model | DynamicModel:
    """Import ``model`` (an ONNX file, bytes, ModelProto, or a ``roller.graph.Graph``), fuse its operators into
    kernels (``fuse``: "solver", the default, or True: the partition of least predicted time; "greedy": the
    rule-based pass; "none" or False: one kernel per operator), build a kernel for each distinct operator on
    ``hw`` (None: this machine's own description, ``host``) with ``backend`` (default: the description's), and
    plan its memory.

    A model whose inputs leave sizes open (``dim_param``) that ``shapes`` does not fix gives a
    ``roller.compiler.dynamic_model.DynamicModel``: built once for every size where one kernel per operator
    serves them all (``generic``), else each set of sizes at its first run; ``ranges`` bounds each open size by
    name (default 1 to 4096). A ``torch.nn.Module`` is exported to ONNX first, called on ``example_inputs``
    (a sequence of CPU tensors: ``roller.compiler.torch_export``; its inputs and outputs are then numpy
    arrays, as a file's are)."""
    from roller.compiler.dynamic_model import dynamic_model, open_dims
    from roller.compiler.inputs import as_model, checked_shapes
    from roller.compiler.model import build_model, fuse_method, with_shapes
    from roller.compiler.target import Target
    from roller.compiler.torch_export import export_onnx, is_torch_module
    from roller.frontends.onnx import import_model

    check_top_k(top_k)
    method = fuse_method(fuse)
    target = Target.resolve(hw, backend)
    t0 = time.perf_counter()
    if is_torch_module(model):
        if example_inputs is None:
            raise InputError("a torch.nn.Module compiles for the inputs it is called on: pass example_inputs",
                             field="example_inputs")
        if model.training:
            raise InputError("the module is in training mode: call module.eval() first (Roller compiles "
                             "inference)")
        model = export_onnx(model, list(example_inputs))
    elif example_inputs is not None:
        raise InputError("example_inputs apply to a torch.nn.Module; an ONNX model's inputs have their shapes",
                         field="example_inputs")
    given = as_model(model)
    source = given.proto
    if given.graph is not None:
        graph = given.graph
    else:
        shapes = checked_shapes(shapes, source)
        dims = open_dims(source, shapes)
        if dims:
            options = {"top_k": top_k, "evaluate": evaluate, "cache": cache, "jobs": jobs, "progress": progress,
                       "fuse": method}
            return dynamic_model(source, target, dims, ranges, options, generic=generic)
        graph = import_model(source, shapes, source=given.source, data=given.data)
        given = dataclasses.replace(given, data=None)   # the file's bytes are not kept through the build
        source = with_shapes(source, shapes) if shapes else source
    imported = time.perf_counter() - t0
    built = build_model(graph, target, method=method, top_k=top_k, evaluate=evaluate, cache=cache, jobs=jobs,
                        progress=progress, source=source)
    built.compile_s = time.perf_counter() - t0
    if built.stages is not None:
        built.stages.seconds = {"import": imported, **built.stages.seconds}
    built.source_file = given.source
    if not built.on_device:
        import warnings

        from roller.errors import HostOnlyWarning

        warnings.warn(f"{built.name}: every output was computed at import on the host (the inputs it depends on are "
                      "constants, or were folded as constants): nothing runs on the device", HostOnlyWarning,
                      stacklevel=2)
    return built


def load(folder: str | Path, hw: HwLike | Target | None = None) -> Any:
    """What ``roller build`` wrote to ``folder``, ready to run: a ``Kernel`` (one op's folder), a
    ``GenericKernel`` (a kernel set's), a ``Model`` (a model's), or a list of kernels and kernel sets (a folder
    of op folders), without the op or model file and without building anything again. ``hw`` defaults to the
    description the folder was built for."""
    from roller.compiler.artifact import kind_of
    from roller.compiler.kernel import Kernel
    from roller.compiler.kernel_set import GenericKernel
    from roller.compiler.model import Model

    path = Path(folder)
    if not path.is_dir():
        raise InputError("no such build folder" if not path.exists() else "not a folder", source=str(path))
    kind = kind_of(path)
    if kind == "kernels":
        subs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        return [load(sub, hw) for sub in subs]
    loaders: dict[str, Any] = {"model": Model.load, "kernel set": GenericKernel.load, "kernel": Kernel.load}
    return loaders[kind](path, hw)
