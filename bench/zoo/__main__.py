"""python -m bench.zoo --out DIR [--models NAME ...] [--force] [--keep-batchnorm] [--latency] [--markdown]"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # run as `python bench/zoo`: make the package importable under its own name
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import onnx

from bench.zoo import SPECS, default_dir, ensure, path_of
from bench.zoo.check import ort_latency_ms, summarize, verify


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__)
    ap.add_argument("--out", type=Path, default=default_dir(), help=f"folder for the .onnx files ({default_dir()})")
    ap.add_argument("--models", nargs="+", choices=list(SPECS), default=list(SPECS), metavar="NAME",
                    help=f"default: all ({', '.join(SPECS)})")
    ap.add_argument("--force", action="store_true", help="export again even where the file exists")
    ap.add_argument("--keep-batchnorm", action="store_true",
                    help="keep BatchNorm nodes (not folded into the Convs); writes <model>-bn.onnx")
    ap.add_argument("--latency", action="store_true",
                    help="also time onnxruntime (2 threads, all graph optimisations, median of 10 after 3 warm-ups)")
    ap.add_argument("--markdown", action="store_true", help="end with the table as markdown rows")
    args = ap.parse_args(argv)

    rows = []
    for name in args.models:
        path = path_of(name, args.out, args.keep_batchnorm)
        existed = path.exists() and not args.force
        t = time.perf_counter()
        ensure(name, args.out, args.keep_batchnorm, args.force)
        model = onnx.load(path)
        inputs = SPECS[name].example_inputs()
        if existed:
            verify(model, inputs)    # a fresh export is verified against torch already
        s = summarize(model)
        latency = ort_latency_ms(model, inputs) if args.latency else None
        print(f"{name}: {path} ({'kept' if existed else f'exported in {time.perf_counter() - t:.1f} s'}, "
              f"{path.stat().st_size / 2**20:.1f} MiB), verified")
        print(f"  nodes {s.nodes}, parameters {s.params:,}"
              + (f", onnxruntime {latency:.2f} ms" if latency is not None else ""))
        print(f"  inputs  {', '.join(f'{n} {d}' for n, d in s.inputs)}")
        print(f"  outputs {', '.join(f'{n} {d}' for n, d in s.outputs)}")
        print(f"  ops     {s.ops_line()}", flush=True)
        lat = f"{latency:.1f}" if latency is not None else "-"
        rows.append(f"| {name} | {s.nodes} | {s.ops_line()} | {s.params:,} | {lat} |")
    if args.markdown:
        print("\n| model | nodes | op types (count) | parameters | ORT ms |\n|---|---|---|---|---|")
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
