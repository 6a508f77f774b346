"""A progress bar on stderr, drawn only when it is a terminal (builds of many kernels, top-K timing)."""
from __future__ import annotations

import sys
from typing import IO


class Progress:
    """``label [#####.....] 5/10`` on a terminal; silent otherwise."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
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
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {note[:40]:<40}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (len(self.label) + 72) + "\r")
            self.stream.flush()
