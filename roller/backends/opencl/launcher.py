"""Running OpenCL kernels through pyopencl.

Device choice is deterministic: ``ROLLER_CL_DEVICE`` ("platform substring[:device index]") when set, else the
first PoCL platform (Debian's and pip's PoCL can both be installed; sorted by version string so the choice
does not depend on ICD enumeration order), else the first platform.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from roller.backends import Artifact
from roller.backends.c_family.launch import padded_inputs
from roller.backends.opencl import programs
from roller.backends.opencl.env import import_opencl
from roller.dtypes import dtype
from roller.errors import InputError, ToolchainError
from roller.runtime.device import Device, Runner
from roller.settings import settings

POCL_PLATFORM = "Portable Computing Language"
_CTX: dict[str, Any] = {}
# A model's kernels are compiled by a pool of threads; two of them creating the context at once made two, and a
# kernel launched on the other context's queue was not ordered with the executor's copies: the first run of a
# new process read outputs before they were written (a wrong answer that nothing reported).
_CTX_LOCK = threading.Lock()


def pick_device(spec: str | None = None) -> Any:
    """The device kernels run on (and ``roller hw probe`` measures): ``spec`` or ``ROLLER_CL_DEVICE``
    ("platform substring[:device index]"), else the newest PoCL, else the first platform's first device."""
    cl = import_opencl()
    spec = spec if spec is not None else settings.opencl.device
    try:
        platforms = cl.get_platforms()
    except cl.LogicError:
        platforms = []
    if not platforms:
        raise ToolchainError("no OpenCL platform found: apt-get install pocl-opencl-icd (or pip install "
                             "pocl-binary-distribution)")
    if spec:
        sub, colon, idx = spec.partition(":")
        if colon and not idx.strip().isdigit():
            raise InputError(f"{spec!r}: the device index after ':' must be a number", field="ROLLER_CL_DEVICE")
        i = int(idx) if colon else 0
        for p in platforms:
            if sub.lower() in (p.name + " " + p.version).lower():
                devs = p.get_devices()
                if i < len(devs):
                    return devs[i]
        raise InputError(f"no OpenCL device matches {spec!r} (platforms: "
                         f"{', '.join(p.name for p in platforms)})", field="ROLLER_CL_DEVICE")
    pocl = sorted((p for p in platforms if POCL_PLATFORM in p.name), key=lambda p: p.version,
                  reverse=True)
    plat = pocl[0] if pocl else platforms[0]
    devices = plat.get_devices()
    if not devices:
        hint = ""
        if POCL_PLATFORM in plat.name:   # PoCL hides its CPU device when it cannot make its kernel cache
            hint = (f"; PoCL offers none when it cannot write its kernel cache (POCL_CACHE_DIR="
                    f"{os.environ.get('POCL_CACHE_DIR', '~/.cache/pocl')}): make that folder writable or point "
                    "POCL_CACHE_DIR elsewhere")
        raise ToolchainError(f"the OpenCL platform {plat.name!r} has no device{hint}")
    return devices[0]


_VERSIONS: dict[str, str] = {}


def device_version() -> str:
    """``platform | version | device | driver`` of the device kernels run on, ``none`` without one."""
    key = settings.opencl.device or ""
    if key not in _VERSIONS:
        try:
            dev = pick_device()
            _VERSIONS[key] = f"{dev.platform.name} | {dev.platform.version} | {dev.name} | {dev.driver_version}"
        except Exception:  # noqa: BLE001 - no device: render-only
            _VERSIONS[key] = "none"
    return _VERSIONS[key]


def available() -> bool:
    try:
        pick_device()
        return True
    except Exception:  # noqa: BLE001 - any failure to find a device means "not here"
        return False


def why_unavailable() -> str:
    try:
        pick_device()
        return ""
    except Exception as err:  # noqa: BLE001 - the reason is the message
        return str(err)


def context(spec: str | None = None) -> tuple[Any, Any, Any]:
    cl = import_opencl()
    key = spec or settings.opencl.device or ""
    with _CTX_LOCK:
        if key not in _CTX:
            dev = pick_device(spec)
            ctx = cl.Context([dev])
            queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
            _CTX[key] = (ctx, queue, dev)
        return _CTX[key]


def build_options() -> list[str]:
    return ["-cl-fast-relaxed-math"] if settings.opencl.fast_math else []


def require_float64(arts: Sequence[Artifact], dev: Any) -> None:
    """Refuse, in one line, kernels with float64 tensors for a device without double precision (OpenCL makes
    ``cl_khr_fp64`` optional: many GPUs' drivers leave it out), before the compiler fails on ``double``."""
    if "cl_khr_fp64" in dev.extensions.split():
        return
    for art in arts:
        if any(a.get("dtype") == "float64" for a in art.launch.get("arguments", [])):
            raise InputError(f"{art.kernel_name}: float64 tensors need an OpenCL device with cl_khr_fp64, and "
                             f"{dev.name.strip()} has none", field="dtype")


def compile_many(arts: Sequence[Artifact], workdir: Path | None = None, use_cache: bool = True,
                 jobs: int | None = None) -> list[CLRunner]:
    """A runner for each artifact: its kernel from a program the cache holds, else from one program built
    for all the kernels no stored program holds (``programs.py``: why one, and what is kept)."""
    ctx, _, dev = context()
    require_float64(arts, dev)
    options = build_options()
    on = programs.BuildSite(ctx, dev, tuple(options), programs.environment(options, device_version()))
    keys = [programs.kernel_key(a, on) for a in arts]
    found = programs.load_cached(arts, on) if use_cache else {}
    todo: dict[str, Artifact] = {}
    for art, key in zip(arts, keys):
        if key not in found:
            todo.setdefault(key, art)
    found.update(programs.build_all(list(todo.values()), on, workdir, use_cache, jobs))
    return [CLRunner(art, workdir, program=found[key][0], entry=found[key][1]) for art, key in zip(arts, keys)]


class CLRunner(Runner):
    def __init__(self, art: Artifact, workdir: Path | None = None, device: str | None = None,
                 program: Any = None, entry: str | None = None) -> None:
        """``art``'s kernel, from ``program`` (built by ``compile_many`` with the kernel in it, named ``entry``
        there) or from its own source."""
        cl = import_opencl()
        self.art = art
        self.ctx, self.queue, self.dev = context(device)
        src = art.source
        self.options = build_options()
        # A program from compile_many has every work-group function compiled, the generic ones PoCL launches
        # when it does not specialise them: its first launch compiles nothing.
        self.prepared = program is not None and os.environ.get("POCL_WORK_GROUP_SPECIALIZATION") == "0"
        if program is not None:
            self.program = program
        else:
            require_float64([art], self.dev)
            try:
                self.program = cl.Program(self.ctx, src).build(options=self.options)
            except cl.RuntimeError as err:
                raise programs.build_error(art, workdir, err) from None
            programs.count(source_builds=1, kernels_compiled=1)
        # By name, not as an attribute: a kernel named like a Program attribute ('build', 'get_info') would
        # otherwise be that attribute.
        self.kernel = cl.Kernel(self.program, entry or art.kernel_name)
        launch = art.launch
        self.global_size = (launch["global_size"][0],)
        self.local_size = (launch["block"][0],)
        self.args = launch["arguments"]
        self.scalars = tuple(np.int32(a["value"]) for a in launch.get("scalars", []))

    def info(self) -> dict[str, Any]:
        cl = import_opencl()
        wg = cl.kernel_work_group_info
        return {"device": self.dev.name, "local_mem_bytes": self.kernel.get_work_group_info(wg.LOCAL_MEM_SIZE, self.dev),
                "private_mem_bytes": self.kernel.get_work_group_info(wg.PRIVATE_MEM_SIZE, self.dev),
                "max_work_group_size": self.kernel.get_work_group_info(wg.WORK_GROUP_SIZE, self.dev)}

    def _buffers(self, inputs: list[np.ndarray], out: np.ndarray | None) -> tuple[list[Any], Any, np.ndarray]:
        cl = import_opencl()
        mf = cl.mem_flags
        bufs = []
        for spec, arr in zip(self.args[:-1], padded_inputs(self.art.launch, inputs)):
            # Each buffer in its tensor's dtype: a float16 tensor is 2-byte elements to the kernel.
            a: np.ndarray = dtype(spec.get("dtype", "float32")).to_storage(arr)
            bufs.append(cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a))
        oshape = tuple(self.args[-1]["shape"])
        odtype = dtype(self.args[-1].get("dtype", "float32")).storage
        host = out if out is not None and out.dtype == odtype else np.empty(oshape, dtype=odtype)
        obuf = cl.Buffer(self.ctx, mf.WRITE_ONLY, size=max(4, host.nbytes))
        # Zeros where the kernel writes nothing (an output written into a padded buffer's interior), as
        # roller.reference has them, rather than whatever memory the buffer was recycled from.
        cl.enqueue_fill_buffer(self.queue, obuf, np.zeros(1, np.uint8), 0, max(4, host.nbytes))
        return bufs, obuf, host

    def _launch(self, bufs: list[Any], obuf: Any) -> Any:
        return self.kernel(self.queue, self.global_size, self.local_size, *bufs, obuf, *self.scalars)

    def launch(self, buffers: list[Any]) -> Any:
        return self.kernel(self.queue, self.global_size, self.local_size, *buffers, *self.scalars)

    def with_launch(self, blocks: int, shapes: Sequence[tuple[int, ...]], scalars: Sequence[int] = ()) -> CLRunner:
        runner = copy.copy(self)
        runner.global_size = (blocks * self.local_size[0],)
        runner.args = [_sized(spec, shape) for spec, shape in zip(self.args, shapes)]
        if scalars:
            if len(scalars) != len(self.scalars):
                raise ValueError(f"{self.art.kernel_name} takes {len(self.scalars)} scalar arguments, "
                                 f"got {len(scalars)}")
            runner.scalars = tuple(np.int32(v) for v in scalars)
        return runner

    def prepare(self) -> None:
        # One run on zeros (any index read stays in range, every value is finite), on a queue of its own: on the
        # shared one, waiting for it would wait for every other thread's work too.
        if self.prepared:
            return
        cl = import_opencl()
        queue = cl.CommandQueue(self.ctx)
        zeros = [np.zeros(spec["shape"], dtype(spec.get("dtype", "float32")).storage) for spec in self.args[:-1]]
        bufs = [cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
                for a in padded_inputs(self.art.launch, zeros)]
        nbytes = max(4, math.prod(self.args[-1]["shape"]) * dtype(self.args[-1].get("dtype", "float32")).itemsize)
        out = cl.Buffer(self.ctx, cl.mem_flags.WRITE_ONLY, size=nbytes)
        self.kernel(queue, self.global_size, self.local_size, *bufs, out, *self.scalars)
        queue.finish()
        self.prepared = True

    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        cl = import_opencl()
        bufs, obuf, host = self._buffers(inputs, out)
        self._launch(bufs, obuf)
        cl.enqueue_copy(self.queue, host, obuf)
        self.queue.finish()
        kind = dtype(self.args[-1].get("dtype", "float32"))
        if kind.name == "bfloat16":   # the bits back as float32, the host type (a bool output stays its bytes)
            host = kind.from_storage(host)
        if out is not None and host is not out:
            out[...] = host
            return out
        return host

    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        """Median seconds of one run on the device: the kernel, and before it the copy of every input its
        program reads padded into the padded buffer's interior (what a model's executor does each run). With
        ``cold``, every core's cache is overwritten before each run (untimed), as the other kernels of a model
        do between two runs of one: a layer's weights then come from the shared cache or memory, not from the
        core's own, where repeated runs of the kernel alone leave them."""
        bufs, obuf, _ = self._buffers(inputs, None)
        copies = self._pad_copies(bufs, inputs)
        evict = _evictor(self.ctx, self.queue) if cold else None
        for _ in range(warmup):
            for c in copies:
                c()
            self._launch(bufs, obuf).wait()
        times = []
        for _ in range(repeat):
            if evict is not None:
                evict()
            events = [c() for c in copies]
            ev = self._launch(bufs, obuf)
            ev.wait()
            times.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in [*events, ev]))
        return statistics.median(times)

    def _pad_copies(self, bufs: list[Any], inputs: list[np.ndarray]) -> list[Any]:
        """For each padded input, a call that enqueues the copy of the unpadded input, on the device, into the
        padded buffer's interior (returning its last event). The copy's source holds the input itself: copied
        from an uninitialised buffer, the interior held whatever memory was recycled there, denormal floats
        among it, and convolutions timed 30-100x slower than they run on their data."""
        from roller.graph.ir import Piece
        from roller.graph.memory import rects

        cl = import_opencl()
        out = []
        for spec, buf, arr in zip(self.args[:-1], bufs, inputs):
            pad = spec.get("pad")
            if pad is None:
                continue
            kind = dtype(spec.get("dtype", "float32"))
            size = kind.itemsize
            shape = tuple(pad["shape"])
            host = np.asarray(arr)
            if tuple(host.shape) != shape:   # given padded: its interior
                host = host[tuple(slice(b, b + n) for b, n in zip(pad["before"], shape))]
            data: np.ndarray = kind.to_storage(host)
            src = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data) \
                if data.size else cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY, size=max(4, size * math.prod(shape)))
            piece = Piece("x", (0,) * len(shape), tuple(pad["before"]), shape)
            todo = rects(shape, tuple(spec["shape"]), piece, size)

            def copy(buf: Any = buf, src: Any = src, todo: Any = todo) -> Any:
                ev = None
                for r in todo:
                    ev = enqueue_rect(cl, self.queue, buf, src, r.src_offset, r.dst_offset, r.region,
                                      r.src_pitches, r.dst_pitches)
                return ev
            out.append(copy)
        return out


#: bytes written to push a kernel's data out of the cores' own caches (this machine's: 2 MiB of L2 per core;
#: twice the largest per-core cache the bundled CPU descriptions name, for both of two cores)
EVICT_BYTES = 16 << 20
_EVICTORS: dict[int, Any] = {}


def _evictor(ctx: Any, queue: Any) -> Any:
    """A call that enqueues, on ``queue``, a kernel writing ``EVICT_BYTES`` across all the device's cores."""
    if id(queue) not in _EVICTORS:
        cl = import_opencl()
        prg = cl.Program(ctx, "__kernel void rl_evict(__global float4* b) { b[get_global_id(0)] = (float4)(0.0f); }")
        kernel = cl.Kernel(prg.build(), "rl_evict")
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=EVICT_BYTES)
        _EVICTORS[id(queue)] = lambda: kernel(queue, (EVICT_BYTES // 16,), None, buf)
    return _EVICTORS[id(queue)]


def _sized(spec: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    """A launch.json argument at another shape (a padded input's unpadded shape follows)."""
    out = {**spec, "shape": list(shape)}
    pad = spec.get("pad")
    if pad is not None:
        out["pad"] = {**pad, "shape": [d - b - a for d, b, a in zip(shape, pad["before"], pad["after"])]}
    return out


def enqueue_rect(cl: Any, queue: Any, dst: Any, src: Any, src_offset: int, dst_offset: int,
                 region: tuple[int, int, int], src_pitches: tuple[int, int], dst_pitches: tuple[int, int]) -> Any:
    """Enqueue one strided device copy (``roller.graph.memory.Rect``'s fields); its event."""
    if region[1] == 1 and region[2] == 1:
        return cl.enqueue_copy(queue, dst, src, byte_count=region[0], src_offset=src_offset, dst_offset=dst_offset)
    # clEnqueueCopyBufferRect: origins are (bytes, rows, slices); an offset goes in the byte coordinate.
    return cl.enqueue_copy(queue, dst, src, src_origin=(src_offset, 0, 0), dst_origin=(dst_offset, 0, 0),
                           region=region, src_pitches=src_pitches, dst_pitches=dst_pitches)


class CLDevice(Device):
    """The OpenCL device kernels run on (the launcher's context and in-order queue)."""

    def __init__(self, spec: str | None = None) -> None:
        super().__init__()
        self.cl = import_opencl()
        self.ctx, self.queue, self.dev = context(spec)

    @property
    def name(self) -> str:
        return f"{self.dev.name.strip()} ({self.dev.platform.name.strip()})"

    def alloc(self, nbytes: int) -> Any:
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, size=max(4, nbytes))

    def _upload(self, buf: Any, array: np.ndarray) -> None:
        self.cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(array), is_blocking=True)

    def _download(self, buf: Any, array: np.ndarray) -> None:
        self.cl.enqueue_copy(self.queue, array, buf, is_blocking=True)

    def copy(self, dst: Any, src: Any, src_offset: int, dst_offset: int, region: tuple[int, int, int],
             src_pitches: tuple[int, int], dst_pitches: tuple[int, int]) -> None:
        enqueue_rect(self.cl, self.queue, dst, src, src_offset, dst_offset, region, src_pitches, dst_pitches)

    def finish(self) -> None:
        self.queue.finish()
