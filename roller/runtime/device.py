"""What a backend's compiled kernels and device give the layers that run them: ``Runner`` (a compiled kernel)
and ``Device`` (buffers and an in-order queue). They live below the backends so that the executor, which
keeps a model's data on a device, imports no backend."""
from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np


class Runner(abc.ABC):
    """A compiled kernel on a device: call it with numpy inputs, time it, or launch it on device buffers."""

    @abc.abstractmethod
    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Run once on ``inputs`` (in launch.json's argument order); the output array."""

    @abc.abstractmethod
    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        """Median kernel time in seconds; with ``cold``, with the device's caches overwritten before each run
        where the backend can do that (a CPU's), as they are hot otherwise."""

    def prepare(self) -> None:
        """Finish compiling for the device where it compiles at the first launch (PoCL builds the work-group
        function then, the larger part of its compile): a build does it in its pool of threads, so that a model's
        first run does not compile its kernels one after another. Nothing where the device needs nothing."""

    def launch(self, buffers: list[Any]) -> Any:
        """Enqueue one run on ``buffers`` of this backend's ``Device`` (inputs in argument order, then the
        output), after everything enqueued before; returns the launch's event where the device has one."""
        raise NotImplementedError(f"{type(self).__name__} cannot launch on device buffers")

    def with_launch(self, blocks: int, shapes: Sequence[tuple[int, ...]], scalars: Sequence[int] = ()) -> Runner:
        """This kernel launched on its first ``blocks`` blocks, with arguments of ``shapes`` (the inputs as it
        reads them, padded where it reads a padded copy, then the output) and, where given, ``scalars`` for its
        int parameters (launch.json's ``scalars``: a kernel with runtime extents takes the symbol's value): how a
        shape-generic kernel (``roller.construction.generic``) runs a size below the one it was built for."""
        raise NotImplementedError(f"{type(self).__name__} launches the grid it was built with only")


class Device(abc.ABC):
    """The memory of one device on this machine and the queue its work runs in, in order: what a graph
    executor needs to keep data on the device between kernels. Counts what crosses to and from the host."""

    def __init__(self) -> None:
        self.uploads = self.downloads = 0
        self.uploaded_bytes = self.downloaded_bytes = 0

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The device, in words."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` (uninitialised)."""

    def upload(self, buf: Any, array: np.ndarray) -> None:
        """Copy a contiguous host array (already in the buffer's storage type) into ``buf``."""
        self.uploads += 1
        self.uploaded_bytes += array.nbytes
        self._upload(buf, array)

    def download(self, buf: Any, array: np.ndarray) -> None:
        """Copy ``buf`` into a contiguous host array of its storage type, after all work enqueued before."""
        self.downloads += 1
        self.downloaded_bytes += array.nbytes
        self._download(buf, array)

    @abc.abstractmethod
    def _upload(self, buf: Any, array: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _download(self, buf: Any, array: np.ndarray) -> None: ...

    @abc.abstractmethod
    def copy(self, dst: Any, src: Any, src_offset: int, dst_offset: int, region: tuple[int, int, int],
             src_pitches: tuple[int, int], dst_pitches: tuple[int, int]) -> None:
        """A strided device-to-device copy, in order with the kernels: ``region`` is (bytes per row, rows,
        slices), pitches in bytes (row, slice)."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Wait for everything enqueued."""
