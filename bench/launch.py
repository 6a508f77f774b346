"""What one kernel launch costs on the local OpenCL device (PoCL on a CPU), against the whole-model gaps of issue 43.

A model run is a chain of kernels: MobileNetV2 at batch 1 is 54 launches, many of them a few microseconds of
work (a depthwise convolution at 7x7). Measured here, in one process, alternating:

* ``wait``: one empty kernel (one work-item) enqueued and waited for, as the profile times a step alone;
* ``queued``: 100 empty kernels enqueued back to back and waited for once, per kernel, as a run queues them;
* ``copy``: a 64 KiB copy kernel (64 work-groups) enqueued and waited for (a small kernel's work and launch);
* ``copy_queued``: 100 of those back to back, waited for once, per kernel: what a small kernel costs in a run;
* ``switched``: the same with 8 different kernels of that size in turn: what switching kernels adds.

Run: ``python bench/launch.py [--rounds 7] [--json FILE]``. Prints medians in microseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench.models import cpu_name

QUEUED = 100
#: kernels of the same size that differ only in a constant: queued in turn, a launch switches kernels each time
SWITCHED = 8
SOURCE = """
__kernel void empty(__global float* y) { }
__kernel void copy(__global const float4* x, __global float4* y) { y[get_global_id(0)] = x[get_global_id(0)]; }
""" + "".join(f"__kernel void scale{i}(__global const float4* x, __global float4* y) "
              f"{{ y[get_global_id(0)] = x[get_global_id(0)] * {i + 2}.0f; }}\n" for i in range(SWITCHED))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from roller.backends.opencl.env import import_opencl
    from roller.backends.opencl.launcher import POCL_PLATFORM
    from roller.errors import ToolchainError

    try:
        cl = import_opencl()   # with roller's PoCL settings, as its kernels run
    except ToolchainError as err:
        print(err, file=sys.stderr)
        return 5
    devices = [d for p in cl.get_platforms() if POCL_PLATFORM in p.name for d in p.get_devices()]
    if not devices:
        print("no PoCL device here", file=sys.stderr)
        return 5
    ctx = cl.Context(devices[:1])
    queue = cl.CommandQueue(ctx)
    prog = cl.Program(ctx, SOURCE).build()
    empty, copy = prog.empty, prog.copy
    n = 64 * 1024 // 16
    host = np.ones(n * 4, np.float32)
    mf = cl.mem_flags
    x = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    y = cl.Buffer(ctx, mf.READ_WRITE, host.nbytes)

    empty.set_args(y)
    copy.set_args(x, y)
    scales = [getattr(prog, f"scale{i}") for i in range(SWITCHED)]
    for k in scales:
        k.set_args(x, y)
    launch = cl.enqueue_nd_range_kernel   # arguments set once: no per-call argument handling in Python

    def wait() -> None:
        launch(queue, empty, (1,), (1,))
        queue.finish()

    def queued() -> None:
        for _ in range(QUEUED):
            launch(queue, empty, (1,), (1,))
        queue.finish()

    def copied() -> None:
        launch(queue, copy, (n,), (64,))
        queue.finish()

    def copies_queued() -> None:
        for _ in range(QUEUED):
            launch(queue, copy, (n,), (64,))
        queue.finish()

    def switched() -> None:
        for i in range(QUEUED):
            launch(queue, scales[i % SWITCHED], (n,), (64,))
        queue.finish()

    cases: dict[str, tuple[Callable[[], None], int, int]] = {
        "wait": (wait, 200, 1), "queued": (queued, 5, QUEUED), "copy": (copied, 200, 1),
        "copy_queued": (copies_queued, 5, QUEUED), "switched": (switched, 5, QUEUED)}
    for fn, _, _ in cases.values():   # warm-up: the first launches build and map
        fn()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, (fn, reps, per) in cases.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples[name].append((time.perf_counter() - t0) / (reps * per) * 1e6)
    us = {k: statistics.median(v) for k, v in samples.items()}
    what = {"wait": "empty kernel, waited for alone", "queued": f"empty kernel, {QUEUED} queued, per kernel",
            "copy": "64 KiB copy kernel, waited for alone",
            "copy_queued": f"64 KiB copy kernel, {QUEUED} queued, per kernel",
            "switched": f"{SWITCHED} different 64 KiB kernels in turn, {QUEUED} queued, per kernel"}
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()}, {os.cpu_count()} cores", "description": "pocl-cpu",
              "command": "python bench/launch.py --json FILE",
              "target": f"{queue.device.name.strip()} ({queue.device.platform.name.strip()}), medians of "
                        f"{args.rounds} alternating rounds",
              "rows": [{"what": what[k], "us": round(v, 1)} for k, v in us.items()]}
    for k, v in us.items():
        print(f"{k:12s} {v:8.1f} us")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
