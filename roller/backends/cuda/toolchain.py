"""Compiling CUDA kernels without a GPU, reading ptxas' resource report, and detecting a GPU safely.

Compilers, per target: ``nvcc`` for every architecture it lists (``nvcc --list-gpu-code``; CUDA 13 starts at
sm_75); for older ones (V100's sm_70) the CUDA 12 NVRTC from PyPI (``pip install nvidia-cuda-nvrtc-cu12``),
called in-process through ctypes with the CUDA headers of the local toolkit. ``ROLLER_CUDA_COMPILER=nvrtc``
forces NVRTC where both would do. Both run ptxas with ``-v``; its report gives registers per thread, static
shared memory, spills and stack per kernel (``parse_ptxas``).

A compile unit may hold many kernels: one nvcc process compiles a whole suite's kernels for one target, which
is what keeps the compile check fast on two cores. Results (the parsed report) are cached by a hash of the
source, target, compiler and flags under the roller cache directory (``roller.cache``'s results, kind ``cuda``).

GPU detection reads /dev and asks ``nvidia-smi``; it never loads the CUDA driver library, because a failed
driver call can leave the process hanging (see shared reference toolchain notes).
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from roller import cache
from roller.errors import CompileError, ToolchainError
from roller.settings import settings

FORMAT = 1
NVCC_FLAGS = ("-std=c++17", "-Xptxas", "-v")
NVRTC_FLAGS = ("-std=c++17", "--ptxas-options=-v")
#: parallel compiler processes (the CI machine has two cores)
DEFAULT_JOBS = 2


@dataclass(frozen=True)
class Usage:
    """What ptxas reported for one kernel."""

    kernel: str
    registers: int
    smem_bytes: int  # static shared memory
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    barriers: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class UnitResult:
    """One compile unit: the per-kernel report, the compiler used, its log and how long it took."""

    target: str
    compiler: str
    usage: dict[str, Usage]
    log: str
    seconds: float
    cached: bool = False
    cubin: Path | None = None


# -- device detection ------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def gpu_present() -> tuple[bool, str]:
    """(present, why not): an NVIDIA GPU that CuPy can drive. Reads /dev and runs ``nvidia-smi -L``; imports
    cupy (which does not initialise the driver) only after both say there is a GPU."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return False, ("no NVIDIA GPU on this machine (no /dev/nvidia* device): CUDA kernels can be built and "
                       "compile-checked here, not run")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], check=False, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as err:
            return False, f"nvidia-smi -L failed ({err}): the NVIDIA driver is not usable here"
        if out.returncode != 0 or "GPU" not in out.stdout:
            return False, f"nvidia-smi -L lists no GPU: {(out.stderr or out.stdout).strip()[:200]}"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False, "cupy is not installed: pip install 'roller[cuda]' (cupy-cuda12x)"
    return True, ""


# -- compilers -------------------------------------------------------------------------------------------------

def nvcc_path() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = nvcc_path()
    if not nvcc:
        return ""
    out = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "?"


@lru_cache(maxsize=1)
def nvcc_archs() -> frozenset[str]:
    nvcc = nvcc_path()
    if not nvcc:
        return frozenset()
    out = subprocess.run([nvcc, "--list-gpu-code"], check=False, capture_output=True, text=True).stdout
    return frozenset(out.split())


def cuda_include_dir() -> Path | None:
    """The CUDA headers (cuda_fp16.h, mma.h) NVRTC needs: next to nvcc, or under CUDA_HOME/CUDA_PATH."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = nvcc_path()
    if nvcc:
        cands.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    cands.append("/usr/local/cuda")
    for c in cands:
        if c and (Path(c) / "include" / "cuda_fp16.h").exists():
            return Path(c) / "include"
    return None


def nvrtc12_path() -> Path | None:
    """libnvrtc.so.12 from the nvidia-cuda-nvrtc-cu12 wheel (site-packages/nvidia/cuda_nvrtc/lib)."""
    for base in sys.path:
        p = Path(base) / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
        if p.exists():
            return p
    return None


class _Nvrtc:
    """The few NVRTC entry points used, through ctypes (no cuda-python needed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"
        n = ctypes.c_int()
        self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
        arr = (ctypes.c_int * n.value)()
        self.lib.nvrtcGetSupportedArchs(arr)
        self.archs = frozenset(f"sm_{a}" for a in arr)

    def compile(self, source: str, name: str, options: Sequence[str]) -> tuple[int, str, bytes]:
        prog = ctypes.c_void_p()
        rc = self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
        if rc:
            return rc, f"nvrtcCreateProgram failed ({rc})", b""
        try:
            opts = [o.encode() for o in options]
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            cubin = b""
            if rc == 0:
                self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
                out = ctypes.create_string_buffer(size.value)
                self.lib.nvrtcGetCUBIN(prog, out)
                cubin = out.raw
            return rc, log, cubin
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


@lru_cache(maxsize=1)
def nvrtc12() -> _Nvrtc | None:
    path = nvrtc12_path()
    return _Nvrtc(path) if path else None


def compiler_for(target: str) -> str:
    """'nvcc' or 'nvrtc' for ``target`` (e.g. sm_90); ToolchainError when neither can compile for it."""
    forced = (settings.cuda.compiler or "").lower()
    nv = nvrtc12()
    nvrtc_ok = nv is not None and target in nv.archs and cuda_include_dir() is not None
    if forced == "nvrtc" and nvrtc_ok:
        return "nvrtc"
    if target in nvcc_archs() and forced != "nvrtc":
        return "nvcc"
    if nvrtc_ok:
        return "nvrtc"
    have = f"nvcc {nvcc_version()} compiles for {' '.join(sorted(nvcc_archs()))}" if nvcc_path() else "no nvcc"
    raise ToolchainError(f"no CUDA compiler for {target} here ({have}); install the CUDA toolkit, or "
                         f"pip install nvidia-cuda-nvrtc-cu12 (CUDA 12 NVRTC, which still compiles for sm_70; "
                         "it uses the local toolkit's headers)")


def version_text() -> str:
    parts = []
    if nvcc_path():
        parts.append(f"nvcc {nvcc_version()}")
    nv = nvrtc12()
    if nv is not None:
        parts.append(f"nvrtc {nv.version}")
    return " | ".join(parts) or "none"


# -- ptxas report ----------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, Usage]:
    """Per-kernel usage from ``ptxas -v`` output (one 'Compiling entry function' section per kernel)."""
    out: dict[str, Usage] = {}
    name: str | None = None
    props = (0, 0, 0)
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            name, props = m.group(1), (0, 0, 0)
            continue
        if name is None:
            continue
        m = _PROPS.search(line)
        if m:
            props = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = _USED.search(line)
        if m:
            smem, bars = _SMEM.search(line), _BARRIERS.search(line)
            out[name] = Usage(kernel=name, registers=int(m.group(1)), smem_bytes=int(smem.group(1)) if smem else 0,
                              spill_stores=props[1], spill_loads=props[2], stack_bytes=props[0],
                              barriers=int(bars.group(1)) if bars else 0)
            name = None
    return out


# -- compiling -------------------------------------------------------------------------------------------------

def _key(source: str, target: str, compiler: str) -> str:
    flags = NVCC_FLAGS if compiler == "nvcc" else NVRTC_FLAGS
    nv = nvrtc12()
    ver = nvcc_version() if compiler == "nvcc" else (nv.version if nv else "")
    return cache.result_key(str(FORMAT), compiler, ver, target, " ".join(flags), source)


def repro_command(path: Path, target: str, compiler: str) -> str:
    if compiler == "nvcc":
        return shlex.join([nvcc_path() or "nvcc", "-cubin", f"-arch={target}", *NVCC_FLAGS, "-o",
                           str(path.with_suffix(".cubin")), str(path)])
    return shlex.join([sys.executable, "-m", "roller.backends.cuda.toolchain", "--nvrtc", target, str(path)])


def compile_unit(source: str, target: str, workdir: Path | None, name: str, keep_cubin: bool = False,
                 use_cache: bool = True) -> UnitResult:
    """Compile ``source`` (one or many kernels) to a cubin for ``target``; CompileError with the log, the
    kernel file and a repro command when the compiler fails. ``name`` names the file (``<name>.cu``).

    ``keep_cubin`` (the runner's) caches the cubin with the report, so that kernels compiled on a machine
    without a GPU (``bench/gpu.py --precompile``) load on one without a compiler run there."""
    compiler = compiler_for(target)
    key = _key(source, target, compiler)
    hit, cubin = None, None
    if use_cache:
        doc = cache.load_result("cuda", key)
        hit = _from_doc(doc)
        if hit is not None and not keep_cubin:
            return hit
        cubin = _cached_cubin(doc, key) if hit is not None else None
    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="roller-cuda-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.cu"
    cubin_path = path.with_suffix(f".{target}.cubin")
    if hit is not None and cubin is not None:
        cubin_path.write_bytes(cubin)
        hit.cubin = cubin_path
        return hit
    path.write_text(source)
    t0 = time.perf_counter()
    if compiler == "nvcc":
        cmd = [nvcc_path() or "nvcc", "-cubin", f"-arch={target}", *NVCC_FLAGS, "-o", str(cubin_path), str(path)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        rc, log = proc.returncode, (proc.stdout + proc.stderr)
    else:
        nv = nvrtc12()
        assert nv is not None
        inc = cuda_include_dir()
        rc, log, cubin = nv.compile(source, path.name, [f"--gpu-architecture={target}", *NVRTC_FLAGS,
                                                        f"-I{inc}"])
        if rc == 0:
            cubin_path.write_bytes(cubin)
    secs = time.perf_counter() - t0
    if rc != 0:
        raise CompileError(f"{compiler} failed to compile {name} for {target} (exit {rc})\n{_tail(log)}\n"
                           f"kernel: {path}\nrepro: {repro_command(path, target, compiler)}")
    usage = parse_ptxas(log)
    result = UnitResult(target, compiler, usage, log, secs, cubin=cubin_path if keep_cubin else None)
    if use_cache:
        doc = _to_doc(result)
        if keep_cubin:
            doc["cubin_sha256"] = cache.store_blob("cuda", key, cubin_path.read_bytes())
        cache.store_result("cuda", key, doc)
    if not keep_cubin:
        cubin_path.unlink(missing_ok=True)
        if workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    return result


def compile_units(units: Sequence[tuple[str, str, str]], jobs: int = DEFAULT_JOBS,
                  workdir: Path | None = None) -> list[UnitResult]:
    """Compile (name, source, target) units, ``jobs`` at a time (nvcc runs as a process, NVRTC in C with
    the GIL released), in the order given."""
    def one(u: tuple[str, str, str]) -> UnitResult:
        name, source, target = u
        return compile_unit(source, target, (workdir / name) if workdir else None, name)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, units))


def _tail(log: str, lines: int = 60) -> str:
    rows = [r for r in log.strip().splitlines() if "ptxas info" not in r and "bytes stack frame" not in r]
    return "\n".join(rows[-lines:])


def _from_doc(doc: Any) -> UnitResult | None:
    try:
        usage = {k: Usage(**v) for k, v in doc["usage"].items()}
        return UnitResult(doc["target"], doc["compiler"], usage, doc["log"], doc["seconds"], cached=True)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _to_doc(r: UnitResult) -> dict[str, Any]:
    return {"target": r.target, "compiler": r.compiler, "seconds": r.seconds, "log": r.log,
            "usage": {k: u.to_json() for k, u in r.usage.items()}}


def _cached_cubin(doc: Any, key: str) -> bytes | None:
    """The cubin stored with a report (a runner's compile), else None (a compile check's report)."""
    digest = doc.get("cubin_sha256") if isinstance(doc, dict) else None
    return cache.load_blob("cuda", key, digest) if isinstance(digest, str) else None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m roller.backends.cuda.toolchain --nvrtc sm_70 FILE.cu``: the repro of an NVRTC failure."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m roller.backends.cuda.toolchain")
    ap.add_argument("--nvrtc", metavar="TARGET", required=True)
    ap.add_argument("file")
    args = ap.parse_args(argv)
    nv = nvrtc12()
    if nv is None:
        print("libnvrtc.so.12 not found: pip install nvidia-cuda-nvrtc-cu12", file=sys.stderr)
        return 5
    rc, log, _ = nv.compile(Path(args.file).read_text(), Path(args.file).name,
                            [f"--gpu-architecture={args.nvrtc}", *NVRTC_FLAGS, f"-I{cuda_include_dir()}"])
    print(log)
    return 3 if rc else 0


if __name__ == "__main__":
    raise SystemExit(main())
