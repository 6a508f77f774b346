"""Construction time of the top-10 for every op of the 119 suite on every bundled description.

Target on the 2-core development machine: median <= 20 ms and max <= 200 ms per op (the paper: 0.41 s mean for
top-1 on a V100 host; TVM/Ansor about 40 minutes per op). Writes a markdown table (stdout, and --md FILE).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import roller.hw as H
from roller.construction import construct
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--suite", default=str(ROOT / "bench/suites/roller119.json"))
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--md", help="also write the table to this file")
    args = ap.parse_args()
    ops = load_ops(args.suite)
    rows = ["| device | ops | median ms | mean ms | max ms (op) |", "|---|---|---|---|---|"]
    for name in H.list_bundled():
        hw = H.load(name)
        construct(ops[0], hw, top_k=args.top_k)  # warm imports and caches outside the timing
        times = []
        for op in ops:
            t = time.perf_counter()
            construct(op, hw, top_k=args.top_k)
            times.append((time.perf_counter() - t, op.name))
        ms = [t * 1e3 for t, _ in times]
        worst = max(times)
        rows.append(f"| {name} | {len(ops)} | {statistics.median(ms):.1f} | {statistics.mean(ms):.1f} | "
                    f"{worst[0] * 1e3:.1f} ({worst[1]}) |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.md:
        Path(args.md).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
