"""Running a planned graph on a device with its data kept there.

Constants are uploaded once (the first run); a run uploads the inputs, enqueues every kernel launch and
device-to-device copy in order on the device's queue, and downloads the outputs: nothing else crosses to the
host. The buffers of the plan are allocated once and reused by every run, so runs from several threads take
turns (``lock``): concurrent runs would write each other's inputs and read each other's outputs.
"""
from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.graph.ir import Graph
from roller.graph.memory import CopyStep, InputPad, KernelStep, Plan
from roller.runtime.device import Device, Runner
from roller.settings import settings

#: launches of one step back to back per timed sample of the profile (``Executor.time_each_step``)
STEP_CHAIN = 10


class Executor:
    def __init__(self, graph: Graph, plan: Plan, runners: Mapping[str, Runner], device: Device) -> None:
        self.graph = graph
        self.plan = plan
        self.runners = dict(runners)
        self.device = device
        self.buffers = [device.alloc(b.nbytes) for b in plan.buffers]
        self._constants_loaded = False
        self._hosts: dict[str, np.ndarray] = {}
        self.lock = threading.RLock()
        self.poisoned = settings.runtime.poison

    def load_constants(self) -> None:
        """Upload the constants and fill the padded buffers' borders, once per executor."""
        with self.lock:
            if not self._constants_loaded:
                self._load_constants()

    def _load_constants(self) -> None:
        for name, array in self.graph.constants.items():
            v = self.graph.values[name]
            self.device.upload(self.buffers[self.plan.value_buffer[name]], dtype_of(v.dtype).to_storage(array))
        for b in self.plan.buffers:
            if b.fill is not None:
                # The border of a padded buffer: each run's copy writes only the interior.
                kind = dtype_of(self.plan.pads[b.id].dtype)
                host = kind.to_storage(np.full(b.nbytes // kind.itemsize, b.fill, dtype=kind.host))
                self.device.upload(self.buffers[b.id], host)
        self._constants_loaded = True

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs by name, as contiguous arrays of the values' types; InputError naming what is wrong."""
        missing = [n for n in self.graph.inputs if n not in inputs]
        extra = [n for n in inputs if n not in self.graph.inputs]
        if missing or extra:
            want = ", ".join(f"{n} {list(self.graph.values[n].shape)}" for n in self.graph.inputs)
            what = f"missing {', '.join(missing)}" if missing else f"unknown input {', '.join(extra)}"
            raise InputError(f"{what}; the model takes {want}")
        out: dict[str, np.ndarray] = {}
        for name in self.graph.inputs:
            v = self.graph.values[name]
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != v.shape:
                raise InputError(f"input {name!r} has shape {list(arr.shape)}, the model takes {list(v.shape)}")
            out[name] = np.ascontiguousarray(_checked_type(name, arr, v.dtype), dtype=dtype_of(v.dtype).host)
        return out

    def enqueue(self) -> None:
        """Every step of one run, in order, on the device's queue (the inputs already uploaded)."""
        for step in self.plan.steps:
            self._enqueue(step)

    def _enqueue(self, step: KernelStep | CopyStep) -> None:
        bufs = self.buffers
        if isinstance(step, KernelStep):
            self.runners[step.kernel].launch([bufs[b] for b in step.args])
        else:
            for r in step.rects:
                self.device.copy(bufs[step.dst], bufs[step.src], r.src_offset, r.dst_offset, r.region,
                                 r.src_pitches, r.dst_pitches)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays = self.check_inputs(inputs)
        with self.lock:
            return self._run(arrays)

    def poison(self) -> None:
        """Fill every buffer a run writes (all but the constants and the padded buffers' borders) with 0xFF
        bytes: NaN as float32 and float16, -1 as integers. A kernel or copy that reads an element nothing wrote
        in this run then shows it in the outputs (``ROLLER_POISON``)."""
        for b, buf in zip(self.plan.buffers, self.buffers):
            if b.role != "constant" and b.fill is None:
                self.device.upload(buf, np.full(b.nbytes, 0xFF, np.uint8))

    def _run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._constants_loaded:
            self._load_constants()
        if self.poisoned:
            self.poison()
        for name, arr in arrays.items():
            v = self.graph.values[name]
            pad = self.plan.input_pads.get(name)
            if pad is not None:
                arr = self._padded_host(name, pad, arr)
            self.device.upload(self.buffers[self.plan.value_buffer[name]], dtype_of(v.dtype).to_storage(arr))
        self.enqueue()
        outputs = {}
        for name in self.graph.outputs:
            v = self.graph.values[name]
            kind = dtype_of(v.dtype)
            host: np.ndarray = np.empty(v.shape, dtype=kind.storage)
            self.device.download(self.buffers[self.plan.value_buffer[name]], host)
            outputs[name] = kind.from_storage(host).reshape(v.shape)
        return outputs

    def _padded_host(self, name: str, pad: InputPad, arr: np.ndarray) -> np.ndarray:
        """``arr`` inside its padding (``Plan.input_pads``), in a host array kept for the next run: the upload
        writes the border too, with the pad value, and the readers copy nothing."""
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = np.full(pad.shape, pad.value, dtype=arr.dtype)
        host[tuple(slice(b, n - a) for n, (b, a) in zip(pad.shape, pad.pads))] = arr
        return host

    def time(self, inputs: Mapping[str, Any], repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds of each of ``repeat`` runs of the steps alone (inputs uploaded once, nothing downloaded):
        the device's time for the model, launch overheads included."""
        with self.lock:
            self.run(inputs)
            return self.time_steps(repeat, warmup)

    def time_each_step(self, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Median seconds of one launch of each step, on the buffers as a run left them
        (``roller.compiler.profile``): ``repeat`` samples (after ``warmup``) of STEP_CHAIN launches back to
        back, waited for once. A launch waited for alone also pays the device's wake-up: on PoCL (2 cores) an
        empty kernel waited for took 50-65 us, the same kernel queued behind others 3 us, a 64 KiB copy 50-67
        and 5 us (bench/launch.py), so a small step timed alone showed ten times its cost in a run."""
        with self.lock:
            return [statistics.median(t / STEP_CHAIN for t in self._waited(
                functools.partial(self._enqueue_chain, step), repeat, warmup)) for step in self.plan.steps]

    def _enqueue_chain(self, step: KernelStep | CopyStep) -> None:
        for _ in range(STEP_CHAIN):
            self._enqueue(step)

    def time_steps(self, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds of each of ``repeat`` runs of the steps on the buffers as they are (after ``warmup``)."""
        with self.lock:
            return self._waited(self.enqueue, repeat, warmup)

    def _waited(self, enqueue: Callable[[], None], repeat: int, warmup: int) -> list[float]:
        """Seconds of each of ``repeat`` calls of ``enqueue`` after ``warmup``, each waited for on the device."""
        out = []
        for i in range(warmup + repeat):
            t = time.perf_counter()
            enqueue()
            self.device.finish()
            if i >= warmup:
                out.append(time.perf_counter() - t)
        return out


def _checked_type(name: str, arr: np.ndarray, want: str) -> np.ndarray:
    """``arr`` if it may be fed where element type ``want`` is taken: floats and integers for a float input (as
    before: numbers convert), integers whose values the type holds for an integer input, bool for a bool input;
    InputError otherwise (a float fed where int64 is declared would be truncated silently)."""
    kind = dtype_of(want)
    if kind.kind == "bool":
        ok = arr.dtype == np.bool_
    elif kind.integral:
        ok = np.issubdtype(arr.dtype, np.integer)
        if ok and arr.size and np.dtype(arr.dtype) != np.dtype(kind.host):
            info = np.iinfo(kind.host)
            lo, hi = int(arr.min()), int(arr.max())
            if lo < info.min or hi > info.max:
                raise InputError(f"input {name!r} holds {lo if lo < info.min else hi}, outside {want}'s range "
                                 f"[{info.min}, {info.max}]")
    else:
        ok = np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
        if ok and np.issubdtype(arr.dtype, np.integer) and arr.size:
            # integers convert, but only where the float type holds them exactly (2^40 + 1 would round)
            back = arr.astype(kind.host).astype(arr.dtype)
            if not np.array_equal(back, arr):
                at = tuple(int(i) for i in np.argwhere(back != arr)[0])
                raise InputError(f"input {name!r} holds {int(arr[at])} (at {list(at)}), which {want} cannot hold "
                                 "exactly; convert it yourself if rounding is meant")
    if not ok:
        raise InputError(f"input {name!r} has dtype {arr.dtype}, the model takes {want}")
    return arr
