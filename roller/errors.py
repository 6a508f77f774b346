"""Errors that reach the user as one line and a distinct exit code.

The CLI catches RollerError, prints ``str(err)`` on stderr and exits with ``err.exit_code``;
a traceback is shown only with ``-v``. Everything else is a bug and keeps its traceback.
"""
from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character that is not printable (a newline, a carriage return, an escape sequence)
    written as its escape: a name taken from a model or a file can then never start a line of Roller's own
    output ("roller: check ok ..." forged by a graph named with a newline)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class RollerError(Exception):
    """Base class: a problem the user can fix, reported in one line."""

    exit_code: int = 1


class InputError(RollerError):
    """Bad op file, hardware description or option (exit 2)."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None, caret: str | None = None) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.caret = caret
        self.bare = message
        where = ""
        if source:
            where = source + (f":{line}" if line is not None else "")
        if field:
            where = f"{where} {field}" if where else field
        text = printable(f"{where}: {message}" if where else message)
        if caret:
            text = f"{text}\n{caret}"
        super().__init__(text)


class CompileError(RollerError):
    """A generated kernel failed to compile (exit 3); the message carries log, file and repro."""

    exit_code = 3


class CheckError(RollerError):
    """A kernel ran but its output disagrees with roller.reference (exit 4)."""

    exit_code = 4


class ToolchainError(RollerError):
    """A compiler, runtime or device is missing here (exit 5); the message says how to install it."""

    exit_code = 5


class HostOnlyWarning(UserWarning):
    """A model compiled to nothing the device runs: every output was computed at import (constant folding),
    so each run only returns those numbers. Said once, in one line, so that an empty ``m.kernels`` is never a
    silent success."""


class UnsafeCacheWarning(UserWarning):
    """The kernel cache folder belongs to another user or others may write into it, so it is not used (a
    kernel planted there would run as this user)."""
