"""``roller hw``: list, show, validate and probe hardware descriptions.

The ``--hw NAME|FILE`` / ``--set KEY=VALUE`` options that every subcommand shares are ``roller.cli.common``'s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import yaml

from roller import hw
from roller.atomic import write_atomic
from roller.cli.common import add_set_argument, overrides_from_args
from roller.compiler.target import load_description, local_names
from roller.errors import InputError, RollerError
from roller.hw.loader import format_size

# -- subcommands ----------------------------------------------------------------------------------------------

def register(sub: Any) -> None:
    parser = sub.add_parser("hw", help="list, show, validate and probe hardware descriptions",
                            description="Hardware descriptions (YAML): bundled ones live in roller/hwdesc.")
    hsub = parser.add_subparsers(dest="hw_command", metavar="ACTION", parser_class=type(parser))
    parser.set_defaults(func=lambda args: _help(parser))

    p = hsub.add_parser("list", help="table of the bundled descriptions and their key numbers")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list)

    p = hsub.add_parser("show", help="print one description, normalized (sizes in bytes, defaults resolved)")
    p.add_argument("target", metavar="NAME|FILE")
    p.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    add_set_argument(p)
    p.set_defaults(func=cmd_show)

    p = hsub.add_parser("validate", help="check description files; exit 2 if any is invalid")
    p.add_argument("files", nargs="+", metavar="FILE")
    add_set_argument(p)
    p.set_defaults(func=cmd_validate)

    p = hsub.add_parser("probe", help="measure the local OpenCL device and write a description (< 1 minute)")
    p.add_argument("-o", "--output", metavar="FILE", default="-", help="where to write the YAML (default: stdout)")
    p.add_argument("--name", default=None, help="the description's name (default: the output file's stem)")
    p.add_argument("--device", default=None, metavar="PLATFORM[:INDEX]",
                   help="OpenCL platform substring and device index (default: $ROLLER_CL_DEVICE, else PoCL, "
                        "else the first platform)")
    p.add_argument("--quick", action="store_true", help="small sizes and few runs (a few seconds, noisier)")
    p.set_defaults(func=cmd_probe)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _row(d: hw.HardwareDesc) -> dict[str, Any]:
    g = d.memory[0]
    block = next((m for m in d.memory if m.scope == "block"), None)
    fp32 = d.compute["float32"].vector
    matrix = max((c.matrix.effective_tflops for c in d.compute.values() if c.matrix is not None), default=None)
    return {
        "name": d.name, "backend": d.backend, "target": d.target, "units": d.parallelism.compute_units,
        "warp": d.parallelism.warp_size, "mem_bytes": g.capacity_bytes,
        "mem_gbps": g.bandwidth_effective_gbps, "smem_per_block_bytes": block.capacity_per_block_bytes if block else None,
        "smem_gbps": block.bandwidth_effective_gbps if block else None,
        "fp32_tflops": fp32.effective_tflops, "matrix_tflops": matrix, "layers": len(d.memory),
    }


def _fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if x < 1000 else f"{x:.0f}"


def cmd_list(args: argparse.Namespace) -> int:
    rows = [_row(hw.load(name)) for name in hw.list_bundled()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ["NAME", "BACKEND", "TARGET", "UNITS", "WARP", "MEMORY", "MEM GB/s", "SMEM/BLOCK", "SMEM GB/s",
              "FP32 TFLOP/s", "MATRIX TFLOP/s"]
    table = [header]
    for r in rows:
        table.append([r["name"], r["backend"], r["target"], str(r["units"]), str(r["warp"]),
                      format_size(r["mem_bytes"]) if r["mem_bytes"] % 2**20 == 0 else f"{r['mem_bytes'] / 1e9:.3g}GB",
                      _fmt_num(r["mem_gbps"]), format_size(r["smem_per_block_bytes"]),
                      _fmt_num(r["smem_gbps"]), _fmt_num(r["fp32_tflops"]), _fmt_num(r["matrix_tflops"])])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    numeric = set(range(3, len(header)))
    for row in table:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    print("effective values (measured or derated); sizes per block; `roller hw show NAME` for everything",
          file=sys.stderr)
    for name in local_names():
        print(f"--hw {name}: this machine's device, measured the first time it is used (docs/hwdesc.md)",
              file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    d = load_description(args.target, overrides_from_args(args))
    data = d.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"# {d.source} (content hash {d.content_hash()[:16]})")
    print(yaml.safe_dump(_human_sizes(data), sort_keys=False, width=110), end="")
    return 0


def _human_sizes(data: Any, key: str = "") -> Any:
    if isinstance(data, dict):
        return {k: _human_sizes(v, k) for k, v in data.items()}
    if isinstance(data, list):
        return [_human_sizes(v, key) for v in data]
    if key.startswith("capacity") and isinstance(data, int):
        text = format_size(data)
        return data if text == str(data) else text
    return data


def cmd_validate(args: argparse.Namespace) -> int:
    overrides = overrides_from_args(args)
    failed = 0
    for path in args.files:
        try:
            d = load_description(path, overrides)
        except RollerError as err:
            failed += 1
            print(f"roller: error: {err}", file=sys.stderr)
            continue
        print(f"ok  {path}  ({d.summary()})")
    return 2 if failed else 0


def cmd_probe(args: argparse.Namespace) -> int:
    from roller.backends.opencl import probe

    out = args.output
    if out != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        # Checked before the probe's half minute, not after it.
        raise InputError("folder does not exist", source=os.path.dirname(out), field="--output")
    if args.name is not None and not hw.loader.NAME_RE.fullmatch(args.name):
        # Checked before the probe, as the folder is: the name must load back as the description's name.
        raise InputError(f"expected a name of ASCII letters, digits, '-', '_' or '.' (starting with a letter or "
                         f"digit), got {args.name!r}", field="--name")
    name = probe.description_name(args.name or (os.path.splitext(os.path.basename(out))[0] if out != "-"
                                                else "probed-opencl"))
    result = probe.probe(quick=args.quick, device_spec=args.device)
    text = result.to_yaml(name)
    # The result must load back; a failure here is a bug in the probe, not bad input.
    d = hw.load_text(text, out if out != "-" else "<probe>")
    if out == "-":
        sys.stdout.write(text)
    else:
        write_atomic(out, text.encode("utf-8"))
        print(f"roller hw probe: wrote {out} ({d.summary()}) in {result.seconds:.1f} s", file=sys.stderr)
    return 0
