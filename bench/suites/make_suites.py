"""Write bench/suites/roller119.json from the paper's operator list (shared/reference/paper_ops.json).

    python bench/suites/make_suites.py [PAPER_OPS_JSON] [-o OUT] [--check]

PAPER_OPS_JSON defaults to ../shared/reference/paper_ops.json relative to the repository root. Each of the 119
operators of the Roller paper (Zhu et al., OSDI 2022, Figure 10) becomes one named op in the op.json form of
docs/design.md, named by its paper ID (M0..M6, C0..C43, D0..D22, E0..E27, P0..P12, R0..R3), fp32, batch 128:

    matmul            -> matmul M, N, K
    conv2d            -> conv2d N, C, H, W, F, KH, KW, stride, padding, dilation, layout NCHW
    depthwise_conv2d  -> depthwise_conv2d with KH = KW = K, layout NCHW
    relu              -> elementwise fn relu, shapes {"X": [N, C, H, W]}
    avgpool2d         -> avgpool2d N, C, H, W, K, stride, padding
    reduce_sum        -> reduce kind sum, shape, axes

--check compares the result with the file already there and exits 1 if they differ (nothing is written).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO.parent / "shared" / "reference" / "paper_ops.json"
DEFAULT_OUT = Path(__file__).resolve().parent / "roller119.json"
EXPECTED_COUNTS = {"matmul": 7, "conv2d": 44, "depthwise_conv2d": 23, "relu": 28, "avgpool2d": 13, "reduce_sum": 4}


def convert(paper_op: dict, dtype: str) -> dict:
    """One paper_ops.json entry -> one named op (design.md table)."""
    kind = paper_op["type"]
    out: dict = {"name": paper_op["id"]}
    if kind == "matmul":
        out.update(op="matmul", M=paper_op["M"], N=paper_op["N"], K=paper_op["K"])
    elif kind == "conv2d":
        out["op"] = "conv2d"
        for key in ("N", "C", "H", "W", "F", "KH", "KW", "stride", "padding", "dilation"):
            out[key] = paper_op[key]
        out["layout"] = "NCHW"
    elif kind == "depthwise_conv2d":
        out["op"] = "depthwise_conv2d"
        for key in ("N", "C", "H", "W"):
            out[key] = paper_op[key]
        out.update(KH=paper_op["K"], KW=paper_op["K"], stride=paper_op["stride"], padding=paper_op["padding"],
                   dilation=paper_op["dilation"], layout="NCHW")
    elif kind == "relu":
        out.update(op="elementwise", fn="relu", shapes={"X": list(paper_op["shape"])})
    elif kind == "avgpool2d":
        out["op"] = "avgpool2d"
        for key in ("N", "C", "H", "W", "K", "stride", "padding"):
            out[key] = paper_op[key]
    elif kind == "reduce_sum":
        out.update(op="reduce", kind="sum", shape=list(paper_op["shape"]), axes=list(paper_op["axes"]))
    else:
        raise ValueError(f"{paper_op.get('id')}: unknown operator type {kind!r}")
    out["dtype"] = dtype
    return out


def build(source: Path) -> dict:
    data = json.loads(source.read_text())
    dtype = data.get("dtype", "float32")
    ops = [convert(op, dtype) for op in data["ops"]]
    counts: dict[str, int] = {}
    for op in data["ops"]:
        counts[op["type"]] = counts.get(op["type"], 0) + 1
    if counts != EXPECTED_COUNTS or len({op["name"] for op in ops}) != 119:
        raise ValueError(f"{source}: expected 119 operators with distinct IDs {EXPECTED_COUNTS}, got {counts}")
    return {"ops": ops}


def dumps(suite: dict) -> str:
    """One op per line, so that a diff shows which operator changed."""
    lines = [json.dumps(op) for op in suite["ops"]]
    return '{\n  "ops": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE, help="paper_ops.json")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="output suite file")
    parser.add_argument("--check", action="store_true", help="only compare with the existing output file")
    args = parser.parse_args(argv)
    text = dumps(build(args.source))
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(text)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(json.loads(text)['ops'])} ops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
