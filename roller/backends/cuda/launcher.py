"""Running CUDA kernels through CuPy.

The kernel is compiled to a cubin for the GPU's own architecture by the same toolchain as the compile check
(nvcc, or the CUDA 12 NVRTC), and loaded with ``cupy.RawModule(path=...)``; where neither compiler is
installed, CuPy's NVRTC compiles the source (``RawModule(code=...)``) with the local toolkit's headers. Launch
shape and dynamic shared memory come from launch.json; above 48 KiB the kernel opts in through
``max_dynamic_shared_size_bytes`` (cudaFuncAttributeMaxDynamicSharedMemorySize).

Only constructed after ``toolchain.gpu_present()`` said yes: nothing here runs on a machine without a GPU.
"""
from __future__ import annotations

import copy
import math
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from roller.backends import Artifact
from roller.backends.cuda import toolchain
from roller.dtypes import dtype
from roller.errors import CompileError, ToolchainError
from roller.runtime.device import Device, Runner


def _cupy() -> Any:
    ok, why = toolchain.gpu_present()
    if not ok:
        raise ToolchainError(why)
    import cupy

    return cupy


def device_target() -> str:
    """sm_XY of the current GPU."""
    cp = _cupy()
    return f"sm_{cp.cuda.Device().compute_capability}"


def device_name() -> str:
    cp = _cupy()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


class CudaRunner(Runner):
    def __init__(self, art: Artifact, workdir: Path | None = None) -> None:
        cp = _cupy()
        self.cp = cp
        self.art = art
        launch = art.launch
        self.grid = tuple(launch["grid"])
        self.block = tuple(launch["block"])
        self.dyn = int(launch.get("dynamic_shared_bytes", 0))
        self.args = launch["arguments"]
        self.scalars = tuple(np.int32(a["value"]) for a in launch.get("scalars", []))
        self.target = device_target()
        folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="roller-cuda-"))
        try:
            res = toolchain.compile_unit(art.source, self.target, folder, art.kernel_name, keep_cubin=True)
            self.compiler = res.compiler
            assert res.cubin is not None
            self.module = cp.RawModule(path=str(res.cubin))
        except ToolchainError:
            self.compiler = "cupy-nvrtc"
            inc = toolchain.cuda_include_dir()
            opts = ("-std=c++17",) + ((f"-I{inc}",) if inc else ())
            try:
                self.module = cp.RawModule(code=art.source, options=opts, backend="nvrtc")
                self.module.compile()
            except cp.cuda.compiler.CompileException as err:
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / art.main_file
                path.write_text(art.source)
                raise CompileError(f"NVRTC (cupy) failed to compile {art.kernel_name} for {self.target}\n"
                                   f"{err}\nkernel: {path}\nrepro: python -c \"import cupy; cupy.RawModule("
                                   f"code=open({str(path)!r}).read(), options={opts!r}).compile()\"") from None
        self.kernel = self.module.get_function(art.kernel_name)
        if self.dyn > 48 * 1024:
            self.kernel.max_dynamic_shared_size_bytes = self.dyn
        # split-K (launch.json ``split_k``): the partials' workspace belongs to the runner, allocated once and
        # reused by every launch (launches on one stream run in order, so one launch's second kernel has read it
        # before the next launch's first kernel writes it)
        self.split = launch.get("split_k")
        self.workspace: Any = None
        self.reduce_kernel: Any = None
        if self.split is not None:
            self.reduce_kernel = self.module.get_function(self.split["reduce_kernel"])
            self.workspace = cp.empty(tuple(self.split["workspace_shape"]), dtype=cp.float32)

    def info(self) -> dict[str, Any]:
        k = self.kernel
        return {"device": device_name(), "target": self.target, "compiler": self.compiler,
                "registers": k.num_regs, "smem_bytes": k.shared_size_bytes + self.dyn,
                "local_bytes": k.local_size_bytes, "max_threads_per_block": k.max_threads_per_block}

    def upload(self, inputs: list[np.ndarray]) -> list[Any]:
        """Device copies of the inputs, in the kernel's element types."""
        cp = self.cp
        return [cp.asarray(dtype(spec["dtype"]).to_storage(a)) for spec, a in zip(self.args[:-1], inputs)]

    def alloc_output(self) -> Any:
        spec = self.args[-1]
        return self.cp.empty(tuple(spec["shape"]), dtype=dtype(spec["dtype"]).storage)

    def launch(self, buffers: list[Any]) -> None:
        if self.split is None:
            self.kernel(self.grid, self.block, (*buffers, *self.scalars), shared_mem=self.dyn)
            return
        self.kernel(self.grid, self.block, (*buffers, *self.scalars, self.workspace), shared_mem=self.dyn)
        self.reduce_kernel(tuple(self.split["reduce_grid"]), tuple(self.split["reduce_block"]),
                           (self.workspace, buffers[-1]))

    def with_launch(self, blocks: int, shapes: Sequence[tuple[int, ...]], scalars: Sequence[int] = ()) -> CudaRunner:
        if self.split is not None:
            raise ValueError(f"{self.art.kernel_name}: a split-K kernel serves one size (no sub-grid launch)")
        runner = copy.copy(self)
        runner.grid = (blocks, 1, 1)
        runner.args = [{**spec, "shape": list(shape)} for spec, shape in zip(self.args, shapes)]
        if scalars:
            runner.scalars = tuple(np.int32(v) for v in scalars)
        return runner

    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        dev = self.upload(inputs)
        y = self.alloc_output()
        self.launch([*dev, y])
        host = dtype(self.args[-1]["dtype"]).from_storage(self.cp.asnumpy(y))
        if out is not None:
            out[...] = host
            return out
        return host

    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        return self.time_device(self.upload(inputs), self.alloc_output(), repeat, warmup)

    def time_device(self, dev_inputs: list[Any], dev_out: Any, repeat: int = 10, warmup: int = 2) -> float:
        """Median seconds of one launch, from CUDA events around samples of launches back to back
        (``time_events``)."""
        return time_events(lambda: self.launch([*dev_inputs, dev_out]), repeat, warmup)


def time_events(fn: Any, repeat: int = 10, warmup: int = 2, min_sample_s: float = 2e-3) -> float:
    """Median seconds of one ``fn()`` on the current stream: after ``warmup`` calls, ``repeat`` samples of N
    calls back to back between one pair of CUDA events, N chosen so that a sample lasts ``min_sample_s``.

    Events around each single call would time the host's launch of it too (CuPy's RawKernel call for Roller,
    ``cupy.matmul``'s larger dispatch for cuBLAS), a double-digit share of ops under 100 us, and unequal
    between the sides; back to back, each launch is queued while the previous one runs, as in a model."""
    cp = _cupy()
    for _ in range(max(1, warmup)):
        fn()
    cp.cuda.Device().synchronize()
    calls = 1
    times = []
    for i in range(repeat + 1):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        secs = cp.cuda.get_elapsed_time(start, end) * 1e-3 / calls
        if i == 0:  # the probe sizes the samples and is not one of them
            calls = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(min_sample_s / max(secs, 1e-7))))
            continue
        times.append(secs)
    return statistics.median(times)


#: launches per timed sample at most (a 1 us kernel then samples 10 ms)
MAX_CALLS_PER_SAMPLE = 10_000


class CupyDevice(Device):
    """The current CUDA device through CuPy: buffers are byte arrays, copies go through the runtime's memcpy on
    the null stream, in order with the kernels CuPy launches there. Written for the graph executor; it ran
    ResNet-18, MobileNetV2 and a BERT-base layer on an H200 (bench/gpu_checks.py models)."""

    def __init__(self) -> None:
        super().__init__()
        self.cp = _cupy()

    @property
    def name(self) -> str:
        return device_name()

    def alloc(self, nbytes: int) -> Any:
        return self.cp.empty(max(4, nbytes), dtype=self.cp.uint8)

    def _upload(self, buf: Any, array: np.ndarray) -> None:
        host = np.ascontiguousarray(array)
        rt = self.cp.cuda.runtime
        rt.memcpy(buf.data.ptr, host.ctypes.data, host.nbytes, rt.memcpyHostToDevice)

    def _download(self, buf: Any, array: np.ndarray) -> None:
        rt = self.cp.cuda.runtime
        self.cp.cuda.Stream.null.synchronize()
        rt.memcpy(array.ctypes.data, buf.data.ptr, array.nbytes, rt.memcpyDeviceToHost)

    def copy(self, dst: Any, src: Any, src_offset: int, dst_offset: int, region: tuple[int, int, int],
             src_pitches: tuple[int, int], dst_pitches: tuple[int, int]) -> None:
        rt = self.cp.cuda.runtime
        width, rows, slices = region
        for z in range(slices):
            s = src.data.ptr + src_offset + z * src_pitches[1]
            d = dst.data.ptr + dst_offset + z * dst_pitches[1]
            rt.memcpy2DAsync(d, dst_pitches[0] or width, s, src_pitches[0] or width, width, rows,
                             rt.memcpyDeviceToDevice, 0)

    def finish(self) -> None:
        self.cp.cuda.Stream.null.synchronize()
