"""Running HIP kernels on a ROCm device through hip-python (``pip install hip-python``, matching the ROCm
version; AMD's ``hip`` module: ``hip.hip`` mirrors the HIP C API and returns ``(error, result...)`` tuples).

The kernel is compiled with hipcc for the device that is present (``--genco``: a code object, no host code),
loaded with ``hipModuleLoadData`` and launched with ``hipModuleLaunchKernel`` on the grid and block of
launch.json; arguments are device pointers in launch.json's order. A description's kernels can run on another
AMD device (its ``gcnArchName`` is the compile target) as long as the wavefront width agrees: the kernel
asserts the description's width at compile time.

Detection never touches the runtime when there is no device: ``/dev/kfd`` (the ROCm kernel driver) must exist
and ``hip`` must import before ``hipGetDeviceCount`` is called. No AMD GPU was available while this was
written; this path is untested here (the compile checks and the CPU emulation are what ran).
"""
from __future__ import annotations

import copy
import ctypes
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from roller.backends import Artifact
from roller.backends.rocm_hip import hipcc
from roller.dtypes import dtype
from roller.errors import ToolchainError
from roller.runtime.device import Runner

if TYPE_CHECKING:
    from roller.hw import HardwareDesc

KFD = Path("/dev/kfd")
_DEVICE: dict[str, Any] = {}


def _hip() -> Any:
    try:
        from hip import hip
    except ImportError:
        raise ToolchainError("hip-python is not installed: pip install hip-python (the version matching your "
                             "ROCm; running HIP kernels also needs an AMD GPU with the ROCm driver)") from None
    return hip


def _check(result: Any) -> Any:
    """hip-python returns (hipError_t, value...): raise on an error, return the value(s)."""
    hip = _hip()
    err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != hip.hipError_t.hipSuccess:
        raise ToolchainError(f"HIP runtime error: {err}")
    return rest[0] if len(rest) == 1 else rest


def why_unavailable() -> str:
    """Empty when a ROCm device is usable here, else the reason (checked without touching the runtime when
    the driver is absent)."""
    if not KFD.exists():
        return ("no ROCm device on this machine (/dev/kfd is missing; the HIP backend only builds and "
                "compile-checks here)")
    try:
        hip = _hip()
    except ToolchainError as err:
        return str(err)
    if "arch" not in _DEVICE:
        try:
            count = _check(hip.hipGetDeviceCount())
            if not count:
                return "the ROCm driver reports no GPU"
            props = hip.hipDeviceProp_t()
            _check(hip.hipGetDeviceProperties(props, 0))
            name = props.gcnArchName
            _DEVICE["arch"] = (name.decode() if isinstance(name, bytes) else str(name)).split(":")[0]
            _DEVICE["name"] = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
            _DEVICE["warp_size"] = int(props.warpSize)
        except ToolchainError as err:
            return str(err)
    return ""


def available() -> bool:
    return why_unavailable() == ""


def device_arch() -> str:
    reason = why_unavailable()
    if reason:
        raise ToolchainError(reason)
    return str(_DEVICE["arch"])


class HipRunner(Runner):
    def __init__(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> None:
        hip = _hip()
        arch = device_arch()
        if _DEVICE["warp_size"] != hw.parallelism.warp_size:
            raise ToolchainError(f"the local GPU ({_DEVICE['name']}, {arch}) has {_DEVICE['warp_size']}-wide "
                                 f"wavefronts; {hw.name}'s kernels are written for {hw.parallelism.warp_size}")
        self.art = art
        folder = workdir or Path(tempfile.mkdtemp(prefix="roller-hip-"))
        # The code object from Roller's cache where an earlier build (or one on a machine without this GPU) kept
        # it: a warm build runs no hipcc.
        self.module = _check(hip.hipModuleLoadData(hipcc.code_object(art, hw, arch, folder)))
        self.function = _check(hip.hipModuleGetFunction(self.module, art.kernel_name.encode()))
        self.grid = tuple(art.launch["grid"])
        self.block = tuple(art.launch["block"])
        self.args = art.launch["arguments"]
        self.scalars = tuple(np.int32(a["value"]) for a in art.launch.get("scalars", []))

    def _device(self, inputs: list[np.ndarray]) -> tuple[list[Any], Any, np.ndarray]:
        hip = _hip()
        bufs = []
        for spec, arr in zip(self.args[:-1], inputs):
            host = dtype(spec["dtype"]).to_storage(arr)
            dev = _check(hip.hipMalloc(max(1, host.nbytes)))
            _check(hip.hipMemcpy(dev, host, host.nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
            bufs.append(dev)
        spec = self.args[-1]
        out = np.empty(tuple(spec["shape"]), dtype=dtype(spec["dtype"]).storage)
        dev_out = _check(hip.hipMalloc(max(1, out.nbytes)))
        return bufs, dev_out, out

    def _launch(self, bufs: list[Any], dev_out: Any) -> None:
        hip = _hip()
        _check(hip.hipModuleLaunchKernel(self.function, *self.grid, *self.block, sharedMemBytes=0, stream=None,
                                         kernelParams=None,
                                         extra=(*bufs, dev_out, *(ctypes.c_int(int(v)) for v in self.scalars))))

    def _free(self, bufs: list[Any], dev_out: Any) -> None:
        hip = _hip()
        for b in (*bufs, dev_out):
            _check(hip.hipFree(b))

    def with_launch(self, blocks: int, shapes: Sequence[tuple[int, ...]], scalars: Sequence[int] = ()) -> HipRunner:
        runner = copy.copy(self)
        runner.grid = (blocks, 1, 1)
        runner.args = [{**spec, "shape": list(shape)} for spec, shape in zip(self.args, shapes)]
        if scalars:
            runner.scalars = tuple(np.int32(v) for v in scalars)
        return runner

    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        hip = _hip()
        bufs, dev_out, host = self._device(inputs)
        try:
            self._launch(bufs, dev_out)
            _check(hip.hipDeviceSynchronize())
            _check(hip.hipMemcpy(host, dev_out, host.nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
        finally:
            self._free(bufs, dev_out)
        host = dtype(self.args[-1]["dtype"]).from_storage(host)
        if out is not None:
            out[...] = host
            return out
        return host

    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        hip = _hip()
        bufs, dev_out, _ = self._device(inputs)
        start, stop = _check(hip.hipEventCreate()), _check(hip.hipEventCreate())
        try:
            for _ in range(warmup):
                self._launch(bufs, dev_out)
            _check(hip.hipDeviceSynchronize())
            times = []
            for _ in range(repeat):
                _check(hip.hipEventRecord(start, None))
                self._launch(bufs, dev_out)
                _check(hip.hipEventRecord(stop, None))
                _check(hip.hipEventSynchronize(stop))
                times.append(float(_check(hip.hipEventElapsedTime(start, stop))) * 1e-3)
        finally:
            _check(hip.hipEventDestroy(start))
            _check(hip.hipEventDestroy(stop))
            self._free(bufs, dev_out)
        return statistics.median(times)

