"""``roller run``: build each op (cached), run it on this machine's device, optionally check it, time it.

One line per op on stdout: ``NAME  HW/BACKEND  TIME ms  RATE  [check ok (max abs/rel error)]  rProgram``,
with GFLOP/s for ops with a reduction and GB/s (compulsory traffic) for the others. Inputs come from
``--inputs in.npz`` (keys: tensor names, or ``OP.TENSOR`` to give ops of one file different arrays), else
``random_inputs(op, seed=0)``. ``--save out.npz`` writes the outputs (key: the output tensor's name, or
``OP.TENSOR`` when several ops run). A model file runs whole (``roller.cli.model_cmd``), and a folder that
``roller build`` wrote runs as it was built, without its op or model file and without building again.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from roller.cli.common import (
    add_common,
    check_save_path,
    hw_from_args,
    inputs_for,
    load_npz,
    positive_int,
    read_input,
    save_npz,
    select_ops,
    target_from_args,
)
from roller.compiler.inputs import BuiltInput, ModelInput, OpInput, SymbolicInput
from roller.errors import InputError
from roller.ir.opfile import symbolic_refused


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="build, run on this machine's device, check against the reference, time",
        description="Build each op (top-1 by the model, or the fastest measured with --eval), run it on the "
                    "local device and print its time and GFLOP/s (reductions) or GB/s (others). The "
                    "description's backend must run here: --hw host (this machine's OpenCL device, probed the "
                    "first time and cached: the default), e.g. --hw pocl-cpu, or any description with --backend "
                    "opencl. A folder that roller build wrote runs as built (default: the description it was "
                    "built for).")
    add_common(p)
    p.add_argument("--inputs", metavar="IN.npz", default=None,
                   help="input arrays by tensor name (OP.TENSOR also accepted); default: random, seed 0")
    p.add_argument("--save", metavar="OUT.npz", default=None, help="write the outputs here (npz)")
    p.add_argument("--check", action="store_true",
                   help="compare with roller.reference, each element within its error bound (it grows with the "
                        "reduction's length and the magnitudes summed); exit 4 on mismatch")
    p.add_argument("--eval", dest="evaluate", action="store_true",
                   help="time the top-K candidates and run the fastest (default: the model's top-1)")
    p.add_argument("--repeat", type=positive_int, default=10, metavar="N",
                   help="timed runs (median, after 2 warm-up runs; default: 10)")
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="do not read or write the kernel cache")
    p.add_argument("--profile", action="store_true",
                   help="a model: after the run, each step timed alone (what it computes, its rate, the model's "
                        "prediction, its share) and the overhead between steps, beside onnxruntime's per-node "
                        "profile when it is installed")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    if Path(args.file).is_dir():
        return _run_built(args, read_input(args))
    hw_from_args(args)   # a bad or missing description is reported before the input
    given = read_input(args)
    if isinstance(given, ModelInput):
        from roller.cli.model_cmd import cmd_run_model

        return cmd_run_model(args, given)
    if isinstance(given, SymbolicInput):
        raise symbolic_refused(given.op)
    assert isinstance(given, OpInput)
    if args.profile:
        raise InputError("--profile applies to a model; an op is one kernel, whose time roller run prints",
                         field="--profile", source=args.file)
    from roller.backends import require_device
    from roller.compiler.kernel import build_kernel

    target = target_from_args(args)
    require_device(target.backend, target.hw, why="roller run")
    ops = select_ops(given, args.op_name)
    return _run_ops(args, ops, lambda i: build_kernel(ops[i], target, top_k=args.top_k, evaluate=args.evaluate,
                                                      use_cache=args.cache, repeat=args.repeat))


def _run_ops(args: argparse.Namespace, ops: list, kernel_of: Any) -> int:
    from roller.compiler.check import check_against, throughput

    if args.save:
        check_save_path(args.save)
    given = load_npz(args.inputs) if args.inputs else None
    bound_all = [inputs_for(op, given, args.inputs) for op in ops]  # all input problems before any work
    outputs: dict[str, np.ndarray] = {}
    for i, (op, bound) in enumerate(zip(ops, bound_all)):
        kernel = kernel_of(i)
        hwd, be = kernel.hw, kernel.backend
        out = kernel(*[bound[n] for n in kernel.input_names])
        note = ""
        if args.check:
            max_abs, max_rel = check_against(f"{op.name} on {hwd.name}/{be.name} ({kernel.program.line()})",
                                             op, bound, out)
            note = f"  check ok (max abs err {max_abs:.2g}, rel {max_rel:.2g})"
        seconds = kernel.benchmark(repeat=args.repeat, inputs=bound)
        rate, unit = throughput(op, seconds)
        chosen = f" (fastest of {len(kernel.evaluation['candidates'])} measured)" if kernel.evaluation else ""
        print(f"{op.name}  {hwd.name}/{be.name}  {seconds * 1e3:.4g} ms  {rate:.4g} {unit}{note}  "
              f"{kernel.program.line()}{chosen}", flush=True)
        outputs[f"{op.name}.{op.output.name}" if len(ops) > 1 else op.output.name] = out
    if args.save:
        save_npz(args.save, outputs)
    return 0


def _run_built(args: argparse.Namespace, given: Any) -> int:
    """A folder ``roller build`` wrote: a model, a kernel, a kernel set, or a folder of op folders."""
    from roller.backends import require_device
    from roller.compiler import load
    from roller.compiler.kernel import Kernel
    from roller.compiler.kernel_set import GenericKernel

    assert isinstance(given, BuiltInput)
    for option, value in (("--op", args.op_name), ("--shape", args.shape), ("--eval", args.evaluate),
                          ("--backend", args.backend)):
        if value:
            raise InputError(f"{option} does not apply to a folder roller build wrote: it runs as built",
                             field=option, source=args.file)
    loaded = load(given.folder, hw_from_args(args) if args.hw else None)
    items = loaded if isinstance(loaded, list) else [loaded]
    first = items[0]
    require_device(first.backend, first.hw, why="roller run")
    if given.kind == "model":
        from roller.cli.model_cmd import run_model

        return run_model(args, first)
    if args.profile:
        raise InputError("--profile applies to a model; this folder holds kernels, whose times roller run prints",
                         field="--profile", source=args.file)
    if any(isinstance(k, GenericKernel) for k in items):
        return _run_sets(args, items)
    kernels: list[Kernel] = [k for k in items if isinstance(k, Kernel)]
    return _run_ops(args, [k.op for k in kernels], lambda i: kernels[i])


def _run_sets(args: argparse.Namespace, items: list) -> int:
    """Kernel sets (and kernels) of a build folder, each at the sizes of its ``--inputs`` arrays (default: the
    greatest sizes of its symbols, random inputs)."""
    from roller.compiler.check import check_against
    from roller.compiler.kernel_set import GenericKernel
    from roller.ir.reference import random_inputs

    if any(not isinstance(k, GenericKernel) for k in items):
        raise InputError("this folder holds kernel sets and kernels side by side; run each op's folder",
                         source=args.file)
    given = load_npz(args.inputs) if args.inputs else None
    if args.save:
        check_save_path(args.save)
    outputs: dict[str, np.ndarray] = {}
    for ks in items:
        if given is None:
            values = {s: r[1] for s, r in ks.op.ranges.items()}
            bound = random_inputs(ks.op.instantiate(values), seed=0)
        else:
            arrays = {t: given.get(f"{ks.name}.{t}", given.get(t)) for t in ks.input_names}
            missing = [t for t, a in arrays.items() if a is None]
            if missing:
                raise InputError(f"no array for input {missing[0]!r} of op {ks.name}", source=args.inputs,
                                 field="--inputs")
            values, bound = ks.bind((), arrays)
        out = ks(**bound)
        expr = ks.op.instantiate(values)
        sizes = ", ".join(f"{s}={v}" for s, v in values.items())
        note = ""
        if args.check:
            max_abs, max_rel = check_against(f"{ks.name} at {sizes}", expr, bound, out)
            note = f"  check ok (max abs err {max_abs:.2g}, rel {max_rel:.2g})"
        seconds = ks.benchmark(values, repeat=args.repeat)
        print(f"{ks.name} at {sizes}  {ks.hw.name}/{ks.backend.name}  {seconds * 1e3:.4g} ms  kernel "
              f"{ks.choice(**values).get('kernel')}{note}", flush=True)
        outputs[f"{ks.name}.{expr.output.name}" if len(items) > 1 else expr.output.name] = out
    if args.save:
        save_npz(args.save, outputs)
    return 0
