"""What the subcommands share: the options of ``build``, ``run`` and ``compare`` (``--hw``/``--set``, the input
file, ``--op``, ``--backend``, ``--top-k``, ``--shape``, ``--fuse``), resolving them once (the ``Target``, the
input read by ``roller.compiler.inputs``), and ``.npz`` files in and out."""
from __future__ import annotations

import argparse
import io
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from roller import hw
from roller.atomic import write_atomic
from roller.compiler.inputs import Input, OpInput, load_input
from roller.compiler.target import Target, default_hw, load_description, local_names, missing_hw
from roller.errors import InputError
from roller.ir.tensor_expr import TensorExpr


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# -- the description --------------------------------------------------------------------------------------------

def add_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="hw_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the description, e.g. parallelism.warp_size=64 or "
                             "memory[1].capacity_per_block_bytes=32KiB (repeatable)")


def add_hw_arguments(parser: argparse.ArgumentParser, *, required: bool = True, default: str | None = None) -> None:
    """Add ``--hw NAME|FILE`` and the repeatable ``--set KEY=VALUE`` to a subcommand's parser."""
    names = ", ".join(hw.list_bundled())
    local = ", ".join(local_names())
    parser.add_argument("--hw", dest="hw", metavar="NAME|FILE", required=required and default is None,
                        default=default, help=f"hardware description: a bundled name ({names}), a YAML file"
                                              + (f", or {local}: this machine's own device, measured the first "
                                                 "time it is used and cached" if local else "")
                                              + ("" if required or default else
                                                 f" (default: {local or 'none'}, where this machine has the device)"))
    add_set_argument(parser)


def overrides_from_args(args: argparse.Namespace) -> dict[str, str]:
    return hw.parse_overrides(getattr(args, "hw_overrides", None) or [])


def hw_from_args(args: argparse.Namespace) -> hw.HardwareDesc:
    """The description named by ``--hw`` with the ``--set`` overrides applied (InputError on any problem); where
    none is named, this machine's own for the commands that build and run (``add_common``: ``default_hw``)."""
    name = getattr(args, "hw", None)
    if not name:
        if not getattr(args, "hw_default", False):
            raise missing_hw("missing --hw NAME|FILE")
        name = default_hw()
    return load_description(name, overrides_from_args(args))


def target_from_args(args: argparse.Namespace) -> Target:
    """The description of ``--hw``/``--set`` and the backend of ``--backend`` (default: the description's)."""
    return Target.resolve(hw_from_args(args), getattr(args, "backend", None))


# -- the input file ---------------------------------------------------------------------------------------------

def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by build and run: the input file, --hw/--set, --op, --backend, --top-k, --shape, --fuse.
    Without --hw they build for this machine's own description (``hw_from_args``)."""
    p.add_argument("file", metavar="OP.json|MODEL.onnx",
                   help="op file (one op or {\"ops\": [...]}) or an ONNX model (built and run whole)")
    add_hw_arguments(p, required=False)
    p.set_defaults(hw_default=True)
    p.add_argument("--op", dest="op_name", metavar="NAME", default=None,
                   help="only the op with this name (default: every op of the file)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="backend to render with (default: the description's; e.g. opencl runs any description's "
                        "kernels on the local OpenCL device)")
    p.add_argument("--top-k", dest="top_k", type=positive_int, default=10, metavar="K",
                   help="candidates to construct (default: 10)")
    p.add_argument("--shape", action="append", default=None, metavar="INPUT=D0,D1,...",
                   help="a model input's static shape (repeatable), where the model leaves it open")
    p.add_argument("--fuse", choices=("solver", "greedy", "none"), default="solver",
                   help="a model's operator fusion: the partition of least predicted time (solver, the "
                        "default), the rule-based pass (greedy), or one kernel per operator (none)")


def read_input(args: argparse.Namespace) -> Input:
    """The input file, read once (``roller.compiler.inputs.load_input``)."""
    return load_input(args.file)


def select_ops(given: OpInput, name: str | None) -> list[TensorExpr]:
    """The ops of an op file, or the one ``--op`` names."""
    if name is None:
        return given.ops
    chosen = [o for o in given.ops if o.name == name]
    if not chosen:
        import difflib

        names = [o.name for o in given.ops]
        hint = difflib.get_close_matches(name, names, n=1)
        raise InputError(f"no op named {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + f"; ops: {', '.join(names)}", source=given.source, field="--op")
    return chosen


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


# -- arrays in and out ------------------------------------------------------------------------------------------

#: the most bytes ``--inputs`` may declare in all (a header claiming 2^40 elements is refused, not allocated)
MAX_INPUT_BYTES = 1 << 34


def load_npz(path: str) -> dict[str, np.ndarray]:
    regular_file(path, "--inputs")
    try:
        _check_npz_headers(path)
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise InputError("a .npy file holds one array; give an .npz of arrays by input name "
                             "(numpy.savez(FILE, name=array, ...))", source=path, field="--inputs")
        with loaded as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except FileNotFoundError:
        raise InputError("no such file", source=path, field="--inputs") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise InputError(f"not a readable .npz file ({err.__class__.__name__}: {err})", source=path,
                         field="--inputs") from None


def _check_npz_headers(path: str) -> None:
    """Each member's declared shape against the bytes it holds, before numpy allocates what a header claims."""
    if not zipfile.is_zipfile(path):
        return   # a .npy, or no archive at all: np.load says which
    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            total += need
            if need > info.file_size or total > MAX_INPUT_BYTES:
                raise InputError(f"member {info.filename!r} declares shape {list(shape)} of {dtype} ({need} bytes), "
                                 f"but holds {info.file_size} bytes" if need > info.file_size else
                                 f"the arrays declare {total} bytes, more than the {MAX_INPUT_BYTES} read",
                                 source=path, field="--inputs")


def regular_file(path: str, field: str) -> None:
    """InputError unless ``path`` is a regular file: a FIFO would block the read forever, a device (/dev/zero)
    never end it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("no such file", source=path, field=field) from None
    except OSError as err:
        raise InputError(f"cannot read it: {err.strerror or err}", source=path, field=field) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file", source=path, field=field)


def check_numeric(name: str, arr: np.ndarray, path: str | None) -> None:
    # Kernels take real numbers: strings would fail deep in numpy, complex numbers lose their imaginary part.
    if arr.dtype.kind not in "biuf":
        raise InputError(f"array {name!r} holds {arr.dtype} values; expected real numbers", source=path,
                         field="--inputs")


def inputs_for(op: Any, given: dict[str, np.ndarray] | None, path: str | None) -> dict[str, np.ndarray]:
    """An op's inputs: from ``--inputs`` (keys: tensor names, or ``OP.TENSOR``), else random (seed 0)."""
    from roller.ir.reference import bind_inputs, random_inputs

    if given is None:
        return random_inputs(op, seed=0)
    chosen: dict[str, np.ndarray] = {}
    for t in op.inputs:
        for key in (f"{op.name}.{t.name}", t.name):
            if key in given:
                check_numeric(key, given[key], path)
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
    if target.is_symlink() or (target.exists() and not target.is_file()):
        # the outputs replace a regular file or make a new one; a device, FIFO or link is never replaced
        raise InputError("exists and is not a regular file (a device, a FIFO or a link)", source=path,
                         field="--save")
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
