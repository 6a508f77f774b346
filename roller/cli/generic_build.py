"""``roller build`` of an op with symbolic sizes: its shape-generic kernel set and the dispatch table.

``DIR/<op>/`` holds one folder per kept kernel (``k0/``, ``k1/``...: the backend's files, ``launch.json``,
``rprogram.json``, each built for the symbol's greatest size) and ``dispatch.json``: which kernel each size takes
(intervals covering the whole range) and how to launch it at a size (blocks and the rows each growing tensor's
buffer must hold; or, for kernels that take the size as an argument, the grid per axis and the layout every
tensor keeps), so that a launcher replays it without the model.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from roller.errors import InputError
from roller.ir.symbolic import SymbolicOp


def build_generic(args: argparse.Namespace, op: SymbolicOp) -> int:
    from roller import __version__
    from roller.backends import for_hw
    from roller.cli.build_cmd import _move_into_place, output_staging
    from roller.cli.hw_cmd import hw_from_args
    from roller.construction.runtime import RuntimeAxes, reduced
    from roller.shape_generic import DeviceTimer, kernel_set

    if args.op_name:
        raise InputError("--op does not apply to an op with symbolic sizes (it is one op)", source=op.source)
    hwd = hw_from_args(args)
    be = for_hw(hwd, args.backend)
    t = time.perf_counter()
    # --eval: the set is chosen by timing the model's shortlist at the sample sizes on this machine's device,
    # and dispatch.json's choices follow the measured times (roller.construction.generic).
    timer = DeviceTimer(op, hwd, be, repeat=args.repeat) if args.evaluate else None
    ks = kernel_set(op, hwd, be, timer)
    if isinstance(ks, str):
        raise InputError(f"{op.name}: one kernel cannot serve every size here ({ks}); build it at a size (write "
                         "the number in place of the symbol)", source=op.source)
    construction_s = time.perf_counter() - t
    if isinstance(ks.axis, RuntimeAxes):
        launch = {
            "launch": "each kernel takes v as its int argument after the buffers; blocks(v) = the product over "
                      "'axes' of ceil(extent / block), where an axis marked runtime has extent v; every tensor is "
                      "held in its layout at the greatest size (each 'growing' dimension is 'greatest' long, its "
                      "first v entries the data: zeros past them in inputs, the output's discarded)",
            "growing": {t: {"dims": list(dims)} for t, dims in ks.axis.written}, "greatest": ks.greatest}
    else:
        launch = {
            # Tensors as written: the dimension that grows and how many of its rows one unit of the symbol is.
            "growing": {t: {"dim": d, "per_value": f} for t, dims in op.growth().items()
                        for d, (s, f) in dims.items() if s == ks.axis.symbol and t in ks.axis.tensors},
            "launch": "blocks(v) = ceil(v * per_value / block_rows) * other_blocks; a growing tensor's buffer holds "
                      "rows(v) = min(ceil(ceil(v * per_value / block_rows) * block_rows / per_value), greatest) "
                      "rows of the symbol (zeros past v in inputs; the output's rows past v are discarded)",
            "per_value": ks.axis.per_value, "greatest": ks.greatest}
    dispatch: dict[str, Any] = {
        "op": op.name, "symbols": {s: list(r) for s, r in op.ranges.items()}, "symbol": ks.axis.symbol,
        "hw": {"name": hwd.name, "hash": hwd.content_hash()}, "backend": be.name, "roller_version": __version__,
        "construction_s": construction_s, "candidates": ks.candidates, "chosen_by": "measured" if
        ks.measured is not None else "model", **launch,
        "kernels": [], "dispatch": ks.intervals(), "samples": ks.table(),
    }
    if timer is not None:
        dispatch["not_timed"] = timer.failed  # candidates that did not render, compile or run here, and why
    out_dir = Path(args.output)
    tmp = output_staging(out_dir)
    try:
        folder = tmp / op.name
        for i, prog in enumerate(ks.programs):
            art = be.render(prog, hwd)
            sub = folder / f"k{i}"
            sub.mkdir(parents=True)
            for name, text in art.files.items():
                (sub / name).write_text(text, encoding="utf-8")
            (sub / "launch.json").write_text(json.dumps(art.launch, indent=2) + "\n", encoding="utf-8")
            (sub / "rprogram.json").write_text(json.dumps(prog.to_json(), indent=2) + "\n", encoding="utf-8")
            entry: dict[str, Any] = {"folder": f"k{i}", "main_file": art.main_file, "line": prog.line()}
            if isinstance(ks.axis, RuntimeAxes):
                walked = reduced(prog.expr)
                entry["axes"] = [{"name": a.name, "extent": a.extent, "block": b, "runtime": a.name in ks.axis.axes}
                                 for a, b in zip(prog.expr.axes, prog.block_tile.shape) if a.name not in walked]
            else:
                lead = -(-prog.expr.axes[0].extent // prog.block_tile.shape[0])
                entry.update(block_rows=prog.block_tile.shape[0], other_blocks=prog.grid // lead)
            dispatch["kernels"].append(entry)
        (folder / "dispatch.json").write_text(json.dumps(dispatch, indent=2) + "\n", encoding="utf-8")
        _move_into_place(tmp, out_dir, [op.name])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.format == "json":
        print(json.dumps(dispatch, indent=2))
    else:
        lo, hi = op.ranges[ks.axis.symbol]
        print(f"{op.name}: wrote {out_dir / op.name}/ ({len(ks.programs)} kernels for {ks.axis.symbol} in [{lo}, "
              f"{hi}], from {ks.candidates} candidates in {construction_s:.2f} s, chosen by {dispatch['chosen_by']}; "
              f"dispatch.json: {len(dispatch['dispatch'])} intervals)")
    return 0
