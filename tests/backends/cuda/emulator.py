"""What the CUDA emulation tests share: a driver program around a rendered kernel, compiled with g++ against
the CUDA stand-in (cuda_emu/cuda_emu.h), its inputs fed from files and its output read back."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

EMU = Path(__file__).resolve().parent / "cuda_emu"
CXX = shutil.which("g++")
CTYPES = {"float64": "double", "float32": "float", "float16": "__half"}


def kernel_source(art: Any) -> str:
    """The artifact's source as the stand-in compiles it: no CUDA headers, and the dynamic shared allocation
    one static array of the launch's size (blocks run one after another here)."""
    src = re.sub(r"^#include <(cuda_fp16|cuda_bf16|mma)\.h>$", "", art.source, flags=re.MULTILINE)
    return src.replace("extern __shared__ __align__(128) unsigned char rl_dyn_smem[];",
                       f"__shared__ __align__(128) unsigned char rl_dyn_smem[{art.launch['dynamic_shared_bytes']}];")


def loads_and_args(specs: list[dict[str, Any]]) -> tuple[str, str]:
    """The driver's buffers (each input read from the file named by its argument, in order; the output
    ``out``) and the kernel's argument list."""
    loads, args = [], []
    for i, s in enumerate(specs):
        n = int(np.prod(s["shape"]))
        var = "out" if s["role"] == "output" else f"in{i}"
        loads.append(f"    static {CTYPES[s['dtype']]} {var}[{n}];")
        if s["role"] == "input":
            loads.append(f"    {{ FILE* f = std::fopen(argv[{i + 1}], \"rb\"); "
                         f"if (std::fread({var}, sizeof(*{var}), {n}, f) != {n}) return 2; std::fclose(f); }}")
        args.append("out" if s["role"] == "output" else f"(const {CTYPES[s['dtype']]}*)in{i}")
    return "\n".join(loads), ", ".join(args)


def compile_driver(cpp: str, tmp: Path) -> Path:
    """``cpp`` compiled against the stand-in; the executable."""
    assert CXX is not None
    (tmp / "k.cpp").write_text(cpp)
    exe = tmp / "k"
    r = subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", f"-I{EMU}", str(tmp / "k.cpp"), "-o", str(exe)],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def run_on(exe: Path, op: Any, x: dict[str, np.ndarray], folder: Path, dtype: type) -> np.ndarray:
    """The emulated kernel's output for inputs ``x`` (every tensor of element type ``dtype``), flat."""
    files = []
    for t in op.inputs:
        f = folder / f"{t.name}.bin"
        np.ascontiguousarray(x[t.name], dtype=dtype).tofile(f)
        files.append(str(f))
    out = folder / "out.bin"
    r = subprocess.run([str(exe), *files, str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=dtype)
