"""``roller run``: build each op (cached), run it on this machine's device, optionally check it, time it.

One line per op on stdout: ``NAME  HW/BACKEND  TIME ms  RATE  [check ok (max abs/rel error)]  rProgram``,
with GFLOP/s for ops with a reduction and GB/s (compulsory traffic) for the others. Inputs come from
``--inputs in.npz`` (keys: tensor names, or ``OP.TENSOR`` to give ops of one file different arrays), else
``random_inputs(op, seed=0)``. ``--save out.npz`` writes the outputs (key: the output tensor's name, or
``OP.TENSOR`` when several ops run).
"""
from __future__ import annotations

import argparse
import io
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from roller.atomic import write_atomic
from roller.cli.build_cmd import add_common, positive_int, setup
from roller.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="build, run on this machine's device, check against the reference, time",
        description="Build each op (top-1 by the model, or the fastest measured with --eval), run it on the "
                    "local device and print its time and GFLOP/s (reductions) or GB/s (others). The "
                    "description's backend must run here: e.g. --hw pocl-cpu, --hw host (this machine's OpenCL "
                    "device, probed the first time), or any description with --backend opencl.")
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
    p.set_defaults(func=cmd_run)


def load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except FileNotFoundError:
        raise InputError("no such file", source=path, field="--inputs") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise InputError(f"not a readable .npz file ({err.__class__.__name__}: {err})", source=path,
                         field="--inputs") from None


def _check_numeric(name: str, arr: np.ndarray, path: str | None) -> None:
    # Kernels take real numbers: strings would fail deep in numpy, complex numbers lose their imaginary part.
    if arr.dtype.kind not in "biuf":
        raise InputError(f"array {name!r} holds {arr.dtype} values; expected real numbers", source=path,
                         field="--inputs")


def inputs_for(op: Any, given: dict[str, np.ndarray] | None, path: str | None) -> dict[str, np.ndarray]:
    from roller.numpy_reference import bind_inputs, random_inputs

    if given is None:
        return random_inputs(op, seed=0)
    chosen: dict[str, np.ndarray] = {}
    for t in op.inputs:
        for key in (f"{op.name}.{t.name}", t.name):
            if key in given:
                _check_numeric(key, given[key], path)
                chosen[t.name] = given[key]
                break
        else:
            raise InputError(f"no array for input {t.name!r} of op {op.name} (keys: {', '.join(sorted(given))})",
                             source=path, field="--inputs")
    try:
        return bind_inputs(op, (), chosen)
    except InputError as err:
        raise InputError(f"op {op.name}: {err.bare}", source=path, field="--inputs") from None


def check_save_path(path: str) -> None:
    """InputError unless ``path`` can take the outputs: checked before any op runs, not after them all."""
    target = Path(path)
    folder = target.resolve().parent
    if not folder.is_dir():
        raise InputError("folder does not exist", source=str(target.parent), field="--save")
    if target.is_dir():
        raise InputError("is a folder; give a file name (e.g. out.npz)", source=path, field="--save")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError("cannot write there: the folder is not writable", source=path, field="--save")


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Atomically: to a temp file next to ``path``, then renamed."""
    target = Path(path)
    check_save_path(path)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types the keyword arrays as bool
    try:
        write_atomic(target, buf.getvalue())
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", source=path, field="--save") from None


def cmd_run(args: argparse.Namespace) -> int:
    from roller.api import build_kernel
    from roller.cli.model_cmd import cmd_run_model, is_model
    from roller.evaluate import check_against, require_device, throughput

    if is_model(args.file):
        return cmd_run_model(args)
    hwd, be, ops = setup(args)
    require_device(be, hwd, why="roller run")
    if args.save:
        check_save_path(args.save)
    given = load_npz(args.inputs) if args.inputs else None
    bound_all = [inputs_for(op, given, args.inputs) for op in ops]  # all input problems before any work
    outputs: dict[str, np.ndarray] = {}
    for op, bound in zip(ops, bound_all):
        kernel = build_kernel(op, hwd, be, top_k=args.top_k, evaluate=args.evaluate, use_cache=args.cache,
                              repeat=args.repeat)
        out = kernel(*[bound[n] for n in kernel.input_names])
        note = ""
        if args.check:
            max_abs, max_rel = check_against(f"{op.name} on {hwd.name}/{be.name} ({kernel.program.line()})",
                                             op, bound, out)
            note = f"  check ok (max abs err {max_abs:.2g}, rel {max_rel:.2g})"
        seconds = kernel.benchmark(repeat=args.repeat, inputs=bound)
        rate, unit = throughput(op, seconds)
        chosen = f" (fastest of {len(kernel.programs)} measured)" if kernel.evaluation else ""
        print(f"{op.name}  {hwd.name}/{be.name}  {seconds * 1e3:.4g} ms  {rate:.4g} {unit}{note}  "
              f"{kernel.program.line()}{chosen}", flush=True)
        outputs[f"{op.name}.{op.output.name}" if len(ops) > 1 else op.output.name] = out
    if args.save:
        save_npz(args.save, outputs)
    return 0
