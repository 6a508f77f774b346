"""What an NVIDIA GPU can do at best, measured the way bench/gpu.py times Roller's kernels (back-to-back
launches between CUDA events, ``time_events``): the numbers a description's ``effective`` values and its
global ``latency_ns`` come from, and the ceilings Roller's ratios are read against.

* copy bandwidth: ``cupy.copyto`` of 1 GiB, and two hand-written copy kernels over the same bytes: one 4-byte
  element per thread (the form of Roller's memory-bound kernels before issue 41) and 16-byte vectors, two in
  flight per thread, over a grid-stride grid of the SMs;
* latency: one thread chasing a random cycle of pointers (dependent loads) through a buffer larger than the
  L2 (memory latency) and through one that fits it (L2 latency), nanoseconds per load;
* cuBLAS through ``cupy.matmul``: float32 4096^3 (no TF32), float16 4096^3 and 8192^3.

``python bench/gpu_ceilings.py --json ceilings.json``; without a GPU it stops with exit 5 and says why.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from roller.atomic import write_atomic

COPY_KERNELS = r"""
extern "C" __global__ void copy_scalar(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void copy_vec2(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {
        float4 a = x[i], b = x[i + stride];
        y[i] = a; y[i + stride] = b;
    }
    if (i < n4) y[i] = x[i];
}
extern "C" __global__ void chase(const long long* __restrict__ next, long long steps, long long* out) {
    long long j = 0;
    for (long long s = 0; s < steps; ++s) j = next[j];
    *out = j;
}
"""


def _cycle(cp: Any, elems: int, stride: int, seed: int) -> Any:
    """A random single cycle over ``elems // stride`` slots ``stride`` elements apart (one slot per 128-byte
    line and more, so that no two hops share a line)."""
    import numpy as np

    slots = elems // stride
    order = np.random.default_rng(seed).permutation(slots)
    nxt = np.zeros(elems, dtype=np.int64)
    nxt[order * stride] = np.roll(order, -1) * stride
    return cp.asarray(nxt)


def latency_ns(cp: Any, fn: Any, nbytes: int, steps: int) -> float:
    """Nanoseconds per dependent load of a pointer chase through ``nbytes``."""
    from roller.backends.cuda.launcher import time_events

    nxt = _cycle(cp, nbytes // 8, 64, seed=1)   # 512 bytes apart: every hop a new line and DRAM burst
    out = cp.zeros(1, dtype=cp.int64)
    secs = time_events(lambda: fn((1,), (1,), (nxt, cp.int64(steps), out)), repeat=3, warmup=1,
                       min_sample_s=0)
    return secs / steps * 1e9


def matmul_tflops(cp: Any, n: int, dtype: str) -> float:
    from roller.backends.cuda.launcher import time_events

    a = cp.random.random((n, n)).astype(dtype)
    b = cp.random.random((n, n)).astype(dtype)
    c = cp.empty((n, n), dtype=dtype)
    secs = time_events(lambda: cp.matmul(a, b, out=c), repeat=5)
    return 2 * n**3 / secs / 1e12


def copy_gbps(cp: Any, mod: Any, sms: int) -> dict[str, float]:
    """GB/s (bytes read + written) of three copies of 1 GiB of float32, far beyond any L2."""
    from roller.backends.cuda.launcher import time_events

    n = 2**28
    x, y = cp.ones(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
    scalar, vec2 = mod.get_function("copy_scalar"), mod.get_function("copy_vec2")
    copies = {
        "cupy_copyto": time_events(lambda: cp.copyto(y, x), repeat=10),
        "scalar_4B_per_thread": time_events(lambda: scalar((n // 256,), (256,), (x, y, cp.int64(n))), repeat=10),
        "vector_16B_x2_grid_stride": time_events(
            lambda: vec2((sms * 8,), (256,), (x, y, cp.int64(n // 4))), repeat=10),
    }
    return {k: 2 * x.nbytes / s / 1e9 for k, s in copies.items()}


def measure(report: Callable[[str, Any], None]) -> None:
    import cupy as cp

    from roller.backends.cuda.launcher import device_name

    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = int(props["multiProcessorCount"])
    report("device", {"name": device_name(), "sms": sms, "l2_bytes": int(props["l2CacheSize"]),
                      "shared_per_block_optin": int(props.get("sharedMemPerBlockOptin", 0))})
    mod = cp.RawModule(code=COPY_KERNELS)
    report("copy_gbps", copy_gbps(cp, mod, sms))
    chase = mod.get_function("chase")
    report("latency_ns", {"dram_1GiB": latency_ns(cp, chase, 2**30, 20000),
                          "l2_8MiB": latency_ns(cp, chase, 8 * 2**20, 20000)})
    cublas = {}
    for size, dt in ((4096, "float32"), (4096, "float16"), (8192, "float16")):
        try:
            cublas[f"{dt}_{size}"] = matmul_tflops(cp, size, dt)
        except Exception as err:  # noqa: BLE001 - a dtype cupy's cuBLAS lacks is a missing entry, not a stop
            cublas[f"{dt}_{size}"] = f"failed: {str(err).splitlines()[0]}"
        report("cublas_tflops", cublas)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu_ceilings.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="write the measurements here (as they come)")
    args = ap.parse_args(argv)
    from roller.backends.cuda.toolchain import gpu_present

    ok, why = gpu_present()
    if not ok:
        print(f"bench/gpu_ceilings.py: {why}", file=sys.stderr)
        return 5
    doc: dict[str, Any] = {"date": datetime.date.today().isoformat()}

    def report(key: str, value: Any) -> None:
        doc[key] = value
        print(f"{key}: {value}", flush=True)
        if args.json:
            write_atomic(args.json, json.dumps(doc, indent=2).encode())

    measure(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
