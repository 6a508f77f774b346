"""``roller build`` and ``roller run`` for a whole model (an ``.onnx`` file instead of an op file).

build: every distinct operator's kernel in ``DIR/<kernel>/`` (the files a per-op build writes), plus
``DIR/plan.json`` (buffers with sizes and roles, the launches and device copies in order, the model's inputs
and outputs), ``DIR/weights.npz`` (the constants by value name) and ``DIR/model.json`` (what was built). The
launchers of any backend can replay the plan. run: the model on this machine's device, one line of timing,
optionally checked against onnxruntime (or the numpy reference, operator by operator).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from roller.errors import InputError

MODEL_SUFFIXES = (".onnx",)


def is_model(path: str) -> bool:
    return Path(path).suffix.lower() in MODEL_SUFFIXES


def parse_shapes(items: list[str] | None) -> dict[str, list[int]]:
    """``["input=1,3,224,224"]`` -> {"input": [1, 3, 224, 224]}."""
    out: dict[str, list[int]] = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            sizes = [int(d) for d in dims.split(",")] if sep and dims.strip() else []
        except ValueError:
            sizes = []
        if not name.strip() or not sizes or any(d <= 0 for d in sizes):
            raise InputError(f"expected NAME=D0,D1,... with positive sizes, got {item!r}", field="--shape")
        out[name.strip()] = sizes
    return out


def model_ops(path: str, shapes: list[str] | None) -> tuple[list[Any], dict[str, Any]]:
    """(the model's distinct operators, {"name", "uses": op name -> nodes it runs}) for ``roller compare``."""
    from roller.frontends.onnx import import_model
    from roller.graph import kernel_key, unique_kernels

    graph = import_model(path, parse_shapes(shapes))
    counts: dict[str, int] = {}
    for n in graph.op_nodes:
        counts[kernel_key(n)] = counts.get(kernel_key(n), 0) + 1
    unique = unique_kernels(graph)
    ops = [node.expr for node in unique.values()]
    return ops, {"name": graph.name, "uses": {unique[k].expr.name: c for k, c in counts.items()}}


def _compile(args: argparse.Namespace, compile_here: bool) -> tuple[Any, Any, Any]:
    from roller.backends import for_hw
    from roller.cli.hw_cmd import hw_from_args
    from roller.frontends.onnx import import_model
    from roller.models import build_kernels, fuse_model_graph

    if getattr(args, "op_name", None):
        raise InputError("--op selects an op of an op file; a model is built whole", field="--op")
    hwd = hw_from_args(args)
    be = for_hw(hwd, args.backend)
    graph, _ = fuse_model_graph(import_model(args.file, parse_shapes(getattr(args, "shape", None))), hwd, be,
                                getattr(args, "fuse", "solver"))
    kernels, _ = build_kernels(graph, hwd, be, top_k=args.top_k, evaluate=getattr(args, "evaluate", False),
                               cache=getattr(args, "cache", True), compile_here=compile_here)
    return hwd, be, (graph, kernels)


def cmd_build_model(args: argparse.Namespace) -> int:
    from roller.graph import InputPad, plan

    if args.dry_run:
        return _dry_run(args)
    hwd, be, (graph, kernels) = _compile(args, compile_here=bool(getattr(args, "evaluate", False)))
    p = plan(graph, {key: InputPad.from_launch(k.launch) for key, k in kernels.items()}, padded_inputs=True)
    p.kernels = {key: k.name for key, k in kernels.items()}
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("output exists and is not a folder", field="-o", source=str(out_dir))
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(out_dir)) from None
    try:
        names = []
        for k in kernels.values():
            folder = tmp / k.name
            folder.mkdir()
            for name, text in k.files.items():
                (folder / name).write_text(text, encoding="utf-8")
            (folder / "launch.json").write_text(json.dumps(k.launch, indent=2) + "\n")
            (folder / "rprogram.json").write_text(json.dumps(k.program.to_json(), indent=2) + "\n")
            names.append(k.name)
        doc = p.to_json()
        doc["kernels"] = {k.name: {"folder": k.name, "main_file": k.artifact.main_file, "line": k.program.line(),
                                   "predicted_ms": k.predicted_ms} for k in kernels.values()}
        (tmp / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
        buf = io.BytesIO()
        np.savez(buf, **{name: arr for name, arr in graph.constants.items()})
        (tmp / "weights.npz").write_bytes(buf.getvalue())
        model_doc = {"model": graph.name, "source": str(args.file), "hw": hwd.name, "backend": be.name,
                     "inputs": {n: list(graph.values[n].shape) for n in graph.inputs},
                     "outputs": {n: list(graph.values[n].shape) for n in graph.outputs},
                     "kernels_built": len(kernels), "kernels_launched": sum(1 for s in doc["steps"]
                                                                             if s["kind"] == "kernel"),
                     "peak_bytes": p.peak_bytes,
                     "predicted_ms": sum(kernels[s.kernel].predicted_ms or 0.0 for s in p.steps
                                         if hasattr(s, "kernel"))}
        (tmp / "model.json").write_text(json.dumps(model_doc, indent=2) + "\n")
        names += ["plan.json", "weights.npz", "model.json"]
        _replace(tmp, out_dir, names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{graph.name}: wrote {out_dir}/ ({model_doc['kernels_built']} kernels for "
          f"{model_doc['kernels_launched']} launches, plan.json, weights.npz); predicted "
          f"{model_doc['predicted_ms']:.4g} ms on {hwd.name}; device memory {p.peak_bytes / 2**20:.1f} MiB")
    return 0


def _replace(tmp: Path, out_dir: Path, names: list[str]) -> None:
    """Move each finished entry of ``tmp`` into ``out_dir``, replacing an earlier build's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        final = out_dir / name
        if final.exists() or final.is_symlink():
            os.rename(final, tmp / f".old-{name}")
        os.rename(tmp / name, final)


def _dry_run(args: argparse.Namespace) -> int:
    from roller.backends import for_hw
    from roller.cli.hw_cmd import hw_from_args
    from roller.construction import construct
    from roller.frontends.onnx import import_model
    from roller.graph import kernel_key, unique_kernels
    from roller.models import fuse_model_graph

    hwd = hw_from_args(args)
    be = for_hw(hwd, args.backend)
    graph, _ = fuse_model_graph(import_model(args.file, parse_shapes(args.shape)), hwd, be, args.fuse)
    uses: dict[str, int] = {}
    for n in graph.op_nodes:
        uses[kernel_key(n)] = uses.get(kernel_key(n), 0) + 1
    rows: list[dict[str, Any]] = []
    total = 0.0
    for key, node in unique_kernels(graph).items():
        prog = construct(node.expr, hwd, top_k=args.top_k, matrix=be.matrix_support)[0]
        ms = prog.prediction.time_s * 1e3 if prog.prediction else 0.0
        total += ms * uses[key]
        rows.append({"kernel": node.expr.name, "uses": uses[key], "predicted_ms": ms, "line": prog.line(),
                     "statement": node.expr.statement(), "origin": node.origin})
    if args.format == "json":
        print(json.dumps({"model": graph.name, "hw": hwd.name, "predicted_ms": total, "kernels": rows}, indent=2))
        return 0
    print(f"{graph.name} on {hwd.name} ({be.name}): {len(rows)} kernels, {len(graph.op_nodes)} launches, "
          f"predicted {total:.4g} ms")
    width = max(len(r["kernel"]) for r in rows) if rows else 6
    for r in rows:
        print(f"  {r['kernel']:<{width}}  x{r['uses']:<3} {r['predicted_ms']:>9.4f} ms  {r['line']}")
    return 0


def cmd_run_model(args: argparse.Namespace) -> int:
    from roller.backends import for_hw
    from roller.cli.hw_cmd import hw_from_args
    from roller.cli.run_cmd import load_npz, save_npz
    from roller.dynamic_model import DynamicModel
    from roller.evaluate import require_device
    from roller.models import compile_model

    if args.op_name:
        raise InputError("--op selects an op of an op file; a model runs whole", field="--op")
    hwd = hw_from_args(args)
    require_device(for_hw(hwd, args.backend), hwd, why="roller run")
    model = compile_model(args.file, hw=hwd, backend=args.backend, top_k=args.top_k,
                          shapes=parse_shapes(args.shape), evaluate=args.evaluate, cache=args.cache,
                          fuse=args.fuse)
    if isinstance(model, DynamicModel):
        if not args.inputs:
            raise InputError(f"the model leaves sizes open ({', '.join(model.symbols)}): give them with --shape "
                             "INPUT=D0,D1,... or run it on arrays from --inputs FILE.npz", source=args.file)
        model = model.model_at(**model.bind(load_npz(args.inputs)))
    feeds = model.random_inputs()
    if args.inputs:
        given = load_npz(args.inputs)
        missing = [n for n in model.input_names if n not in given]
        if missing:
            raise InputError(f"no array for input {missing[0]!r} (keys: {', '.join(sorted(given))})",
                             source=args.inputs, field="--inputs")
        feeds = {n: given[n] for n in model.input_names}
    outputs = model.run(feeds)
    note = ""
    if args.check:
        result = model.check(feeds, outputs)
        worst = max(result["max_abs_error"].values()) if result["max_abs_error"] else 0.0
        note = f"  check ok against {result['reference']} (max abs err {worst:.2g})"
    seconds = model.benchmark(repeat=args.repeat, inputs=feeds)
    s = model.summary()
    print(f"{model.name}  {model.hw.name}/{model.backend.name}  {seconds * 1e3:.4g} ms  {s['kernels_launched']} "
          f"launches ({s['kernels_built']} kernels, {s['copies']} copies)  device memory "
          f"{s['peak_bytes'] / 2**20:.1f} MiB{note}", flush=True)
    if args.save:
        save_npz(args.save, outputs)
    return 0
