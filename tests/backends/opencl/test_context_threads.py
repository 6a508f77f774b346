"""One OpenCL context and queue per device, however many threads ask for it first: a model's kernels are compiled
by a pool of threads, and a kernel on a second queue is not ordered with the executor's copies (the first run of
a process read its outputs before they were written)."""
from __future__ import annotations

import threading
import time

import pytest

from roller.backends import get
from roller.backends.opencl import launcher

CL = get("opencl")


@pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
def test_threads_asking_first_share_one_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    pick = launcher.pick_device

    def slow_pick(spec: str | None = None) -> object:
        time.sleep(0.02)   # the window in which another thread would find no context yet
        return pick(spec)

    monkeypatch.setattr(launcher, "pick_device", slow_pick)
    for _ in range(3):
        monkeypatch.setattr(launcher, "_CTX", {})
        start = threading.Barrier(8)
        queues: list[int] = []

        def ask(start: threading.Barrier = start, queues: list[int] = queues) -> None:
            start.wait()
            queues.append(id(launcher.context()[1]))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(queues)) == 1
