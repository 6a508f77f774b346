"""The build farm's throughput: ``roller compare``'s builds (construction, the model, rendering) of a model zoo x
descriptions on a local Dask cluster of 1 and 2 workers, against the same builds in this process.

    .venv/bin/python bench/farm.py [--models resnet18 mobilenet_v2 ...] [--hw pocl-cpu h100 mi50] [--rounds 3]
                                   [--json OUT]

Models come from ``~/.cache/roller/zoo`` (``python -m bench.zoo``) where present, else ``examples/models``. Two
local clusters are started here, each a real ``dask scheduler`` with one or two ``dask worker`` processes (one
thread each, no nanny); each round runs, alternating: serial in this process (the reference), the one-worker
cluster, the two-worker cluster. Every run's entries are checked equal to the serial build's. Prints builds per
second and the ratios; on one machine the workers share its cores, so this measures the farm's overhead and its
scaling on this machine, not a cluster's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import cpu_name

ZOO = Path.home() / ".cache" / "roller" / "zoo"
DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_base_layer", "resnet50", "efficientnet_b0")


def model_path(name: str) -> Path:
    for folder in (ZOO, ROOT / "examples" / "models"):
        if (folder / f"{name}.onnx").exists():
            return folder / f"{name}.onnx"
    raise SystemExit(f"{name}.onnx is in neither {ZOO} nor examples/models (python -m bench.zoo --out {ZOO})")


def zoo_ops(models: list[str]) -> list[Any]:
    from roller.cli.model_cmd import model_ops
    from roller.compiler.inputs import as_model

    ops = []
    for name in models:
        found, _ = model_ops(as_model(str(model_path(name))), None)
        ops += [dataclasses.replace(op, name=f"{name}_{op.name}") for op in found]
    return ops


class LocalCluster:
    """A real ``dask scheduler`` and ``n`` single-threaded ``dask worker`` processes on localhost."""

    def __init__(self, n: int) -> None:
        from roller.compare.farm import client_for

        dask = str(Path(sys.executable).parent / "dask")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        self.logs = tempfile.mkdtemp(prefix="roller-farm-")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}

        def start(name: str, *args: str) -> subprocess.Popen[bytes]:
            with open(Path(self.logs) / f"{name}.log", "wb") as log:
                return subprocess.Popen([dask, *args], stdout=log, stderr=subprocess.STDOUT, env=env)

        self.procs = [start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")]
        self.procs += [start(f"worker{i}", "worker", self.address, "--nthreads", "1", "--no-nanny",
                             "--no-dashboard", "--name", f"w{i}") for i in range(n)]
        end = time.monotonic() + 60
        with client_for(self.address) as client:
            while len(client.scheduler_info()["workers"]) < n:
                if time.monotonic() > end:
                    raise SystemExit(f"workers did not start: see {self.logs}")
                time.sleep(0.2)

    def close(self) -> None:
        for p in self.procs[::-1]:
            p.kill()
            p.wait()


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--hw", nargs="+", default=["pocl-cpu", "h100", "mi50"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args()

    from roller.compare import collect
    from roller.hw import load

    ops = zoo_ops(args.models)
    hws = [load(h) for h in args.hw]
    n = len(ops) * len(hws)
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); {len(args.models)} models, {len(ops)} distinct ops x "
          f"{len(hws)} descriptions = {n} builds (top-{args.top_k}, with rendering)", file=sys.stderr)

    def build(scheduler: str | None) -> list[dict[str, Any]]:
        return collect.collect(ops, hws, args.top_k, True, None, 1, scheduler=scheduler)

    clusters = {1: LocalCluster(1), 2: LocalCluster(2)}
    times: dict[str, list[float]] = {"serial": [], "1 worker": [], "2 workers": []}
    try:
        reference = None
        for r in range(args.rounds):
            for label, sched in (("serial", None), ("1 worker", clusters[1].address),
                                 ("2 workers", clusters[2].address)):
                s, entries = timed(lambda sched=sched: build(sched))
                key = collect.without_timings(entries)
                reference = reference or key
                if key != reference:
                    raise SystemExit(f"{label}: the entries differ from the serial build's")
                times[label].append(s)
                print(f"round {r + 1}: {label}: {s:.2f} s", file=sys.stderr)
    finally:
        for c in clusters.values():
            c.close()
    base = statistics.median(times["serial"])
    rows = []
    print("| run | median s | builds/s | vs serial |")
    print("|---|---|---|---|")
    for label, ts in times.items():
        med = statistics.median(ts)
        rows.append({"run": label, "rounds_s": " / ".join(f"{t:.2f}" for t in ts), "median_s": round(med, 2),
                     "builds_per_s": round(n / med, 1), "vs_serial": f"{base / med:.2f}x"})
        print(f"| {label} | {med:.2f} | {n / med:.1f} | {base / med:.2f}x |")
    if args.json:
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()}, {os.cpu_count()} cores",
               "command": "python bench/farm.py --json FILE", "python": platform.python_version(),
               "note": (f"{len(args.models)} models ({', '.join(args.models)}): {len(ops)} distinct operators x "
                        f"{', '.join(args.hw)} = {n} builds at top-{args.top_k} with rendering"),
               "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")

if __name__ == "__main__":
    main()
