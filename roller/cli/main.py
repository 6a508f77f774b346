"""The ``roller`` command: subcommands live in ``roller/cli/*_cmd.py``, each with ``register(subparsers)``.

A subcommand's parser sets ``func`` to a callable taking the parsed namespace and returning the exit code.
RollerError becomes one line on stderr and its exit code; ``-v`` keeps the traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
import warnings
from typing import TextIO

from roller.errors import RollerError

# Each module registers one top-level subcommand; a module that is not there yet is skipped, so the
# command grows with the project without a central switch.
_COMMAND_MODULES = ("op_cmd", "hw_cmd", "build_cmd", "run_cmd", "generate_cmd", "compare_cmd", "cache_cmd")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits 2 on bad options, which is our input-error code; keep its one-line form.
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="roller", description="Construct tensor kernels from a hardware description.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and more detail")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"roller.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"roller.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from roller import __version__

    return f"roller {__version__}"


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    # Python's own format adds the file, line and source of the call: a user of the command wants the sentence.
    print(f"roller: warning: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _one_line_warning
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except RollerError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"roller: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        # a model or array larger than the memory this process may use (a ulimit, a container's limit)
        if args.verbose:
            traceback.print_exc()
        print(f"roller: error: out of memory running 'roller {args.command}': the input needs more memory than this "
              "process may use", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``roller op show F | head``): stop quietly, and keep Python from reporting the
        # failed flush of stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
