"""A progress bar on stderr, drawn only when it is a terminal (builds of many kernels, top-K timing), and a
stage's name while it runs (``stage``: the fusion of a model, which has no count to show)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


class Progress:
    """``label [#####.....] 5/10`` on a terminal (``label ...`` for a total of 0: a stage without counts);
    silent otherwise."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.counted = total > 0
        self.total = max(1, total)
        self.done = 0
        self.label = label
        self._draw("")

    def step(self, note: str = "") -> None:
        self.done = min(self.total, self.done + 1)
        self._draw(note)

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        if not self.counted:
            self.stream.write(f"\r{self.label} ...")
            self.stream.flush()
            return
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {note[:40]:<40}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (len(self.label) + 72) + "\r")
            self.stream.flush()


@contextmanager
def stage(label: str, enabled: bool | None = None, stream: IO[str] | None = None) -> Iterator[None]:
    """``label ...`` on a terminal while the block runs, erased after it."""
    shown = Progress(0, label, stream, enabled)
    try:
        yield
    finally:
        shown.close()
