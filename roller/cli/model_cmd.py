"""``roller build`` and ``roller run`` for a whole model (an ``.onnx`` file instead of an op file).

build: the model's build folder (``Model.write``, roller.compiler.artifact): every distinct operator's kernel in
``DIR/<kernel>/`` (the files a per-op build writes), ``DIR/plan.json`` (buffers with sizes and roles, the
launches and device copies in order, the model's inputs and outputs), ``DIR/weights.npz`` (the constants by
buffer id) and ``DIR/model.json`` (what was built); ``roller run DIR`` and ``roller.load(DIR)`` run it again.
run: the model on this machine's device, one line of timing, optionally checked against onnxruntime (or the
numpy reference, operator by operator).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from roller.cli.common import check_save_path, load_npz, parse_shapes, save_npz, target_from_args
from roller.compiler.inputs import ModelInput
from roller.errors import InputError


def model_ops(given: ModelInput, shapes: list[str] | None) -> tuple[list[Any], dict[str, Any]]:
    """(the model's distinct operators, {"name", "uses": op name -> nodes it runs}) for ``roller compare``."""
    from roller.graph import kernel_key, unique_kernels

    graph = _import(given, shapes)
    counts: dict[str, int] = {}
    for n in graph.op_nodes:
        counts[kernel_key(n)] = counts.get(kernel_key(n), 0) + 1
    unique = unique_kernels(graph)
    ops = [node.expr for node in unique.values()]
    return ops, {"name": graph.name, "uses": {unique[k].expr.name: c for k, c in counts.items()}}


def _import(given: ModelInput, shapes: list[str] | None) -> Any:
    from roller.frontends.onnx import import_model

    if given.graph is not None:
        return given.graph
    return import_model(given.proto, parse_shapes(shapes), source=given.source)


def cmd_build_model(args: argparse.Namespace, given: ModelInput) -> int:
    from roller.compiler.model import build_model, fuse_stage

    if getattr(args, "op_name", None):
        raise InputError("--op selects an op of an op file; a model is built whole", field="--op")
    target = target_from_args(args)
    graph = _import(given, getattr(args, "shape", None))
    if args.dry_run:
        return _dry_run(args, target, fuse_stage(graph, target, args.fuse)[0])
    # a kernel database carries the compiled kernels too where this machine can compile them
    here = bool(args.evaluate) or (bool(getattr(args, "db", None)) and target.backend.can_run_here())
    model = build_model(graph, target, method=args.fuse, top_k=args.top_k, evaluate=args.evaluate,
                        cache=args.cache, compile_here=here)
    model.source_file = given.source
    out_dir = Path(args.output)
    doc = model.save(out_dir)
    print(f"{model.name}: wrote {out_dir}/ ({doc['kernels_built']} kernels for {doc['kernels_launched']} launches, "
          f"plan.json, weights.npz); predicted {doc['predicted_ms']:.4g} ms on {model.hw.name}; device memory "
          f"{model.plan.peak_bytes / 2**20:.1f} MiB")
    return 0


def _dry_run(args: argparse.Namespace, target: Any, graph: Any) -> int:
    from roller.graph import kernel_key, unique_kernels

    uses: dict[str, int] = {}
    for n in graph.op_nodes:
        uses[kernel_key(n)] = uses.get(kernel_key(n), 0) + 1
    rows: list[dict[str, Any]] = []
    total = 0.0
    hwd, be = target.hw, target.backend
    for key, node in unique_kernels(graph).items():
        prog = target.programs(node.expr, args.top_k)[0]
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


def cmd_run_model(args: argparse.Namespace, given: ModelInput) -> int:
    from roller.backends import require_device
    from roller.compiler import compile_model
    from roller.compiler.dynamic_model import DynamicModel

    if args.op_name:
        raise InputError("--op selects an op of an op file; a model runs whole", field="--op")
    if args.save:
        check_save_path(args.save)   # before the build, not after it
    target = target_from_args(args)
    require_device(target.backend, target.hw, why="roller run")
    model = compile_model(given, target, top_k=args.top_k, shapes=parse_shapes(args.shape),
                          evaluate=args.evaluate, cache=args.cache, fuse=args.fuse)
    if isinstance(model, DynamicModel):
        if not args.inputs:
            raise InputError(f"the model leaves sizes open ({', '.join(model.symbols)}): give them with --shape "
                             "INPUT=D0,D1,... or run it on arrays from --inputs FILE.npz", source=args.file)
        model = model.model_at(**model.bind(load_npz(args.inputs)))
    return run_model(args, model)


#: the slowest steps (and onnxruntime nodes) ``roller run --profile`` lists; the rest are summed in one line
PROFILE_TOP = 20


def run_model(args: argparse.Namespace, model: Any) -> int:
    """Run a compiled or loaded model once on ``--inputs`` (or random inputs), check it with ``--check``, time
    it, print one line, and write the outputs with ``--save``."""
    if args.save:
        check_save_path(args.save)   # before the run, not after it
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
        if "quantized" in result:   # an output needed the spread between two correct int8 runs
            figures = result["quantized"]["outputs"].values()
            note += (f", mean {max(f['mean'] for f in figures):.2g}: a quantized model, within twice the difference "
                     f"from {result['quantized']['spread_by']} (max {max(f['spread_max'] for f in figures):.2g}, "
                     f"mean {max(f['spread_mean'] for f in figures):.2g})")
    seconds = model.benchmark(repeat=args.repeat, inputs=feeds)
    s = model.summary()
    built = f"  built in {model.compile_s:.1f} s" if model.compile_s else ""   # not a folder loaded back
    print(f"{model.name}  {model.hw.name}/{model.backend.name}  {seconds * 1e3:.4g} ms  {s['kernels_launched']} "
          f"launches ({s['kernels_built']} kernels, {s['copies']} copies)  device memory "
          f"{s['peak_bytes'] / 2**20:.1f} MiB{built}{note}", flush=True)
    if getattr(args, "profile", False):
        print(model.profile(feeds, repeat=args.repeat).render(top=PROFILE_TOP), flush=True)
    if args.save:
        save_npz(args.save, outputs)
    return 0
