"""Build folders: what ``roller build`` writes and ``roller.load`` / ``roller run DIR`` read back.

Three kinds, each written by its class's ``write`` (into a new folder) or ``save`` (the same, staged beside the
folder and moved into place, replacing an earlier build) and read back by its ``load``:

- a kernel (``roller.compiler.kernel.Kernel``): the backend's files, ``launch.json``, ``rprogram.json`` (the
  chosen program, with the op as written), ``report.json`` (the description, the candidates) and, when chosen
  by measurement, ``eval.json``;
- a kernel set (``roller.compiler.kernel_set.GenericKernel``): ``k0/``, ``k1/``... (each a kernel's files,
  ``launch.json`` and ``rprogram.json``) and ``dispatch.json`` (the op with its symbols, which kernel each size
  takes and how it is launched);
- a model (``roller.compiler.model.Model``): a folder per kernel, ``plan.json`` (buffers, launches and copies,
  the values' shapes and types), ``weights.npz`` and ``model.json`` (the description and the ONNX file it came
  from, with its sha256).

A folder holding several of these (``roller build ops.json -o DIR``: one folder per op) is read back as a
list. Every file is checked as it is read: a folder that is not one of these, or a damaged file, is one
InputError naming the file and what is wrong.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.atomic import exchange, staging_dir
from roller.backends import Artifact, require_device
from roller.compiler.target import HwLike, Target, TargetBound
from roller.errors import InputError
from roller.program import RProgram
from roller.runtime.device import Runner

#: the files a kernel folder holds besides the backend's own
KERNEL_FILES = ("launch.json", "rprogram.json", "report.json", "eval.json")


class BuildFolder(TargetBound):
    """What ``roller build`` writes a folder for (a kernel, a kernel set, a model): ``write`` makes the folder,
    ``save`` stages it beside the destination and moves it into place."""

    def write(self, folder: Path) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, folder: str | os.PathLike) -> dict[str, Any]:
        """``write`` staged beside ``folder``, each entry then moved into ``folder`` (replacing an earlier
        build's of the same name; other files there stay)."""
        return staged_write(Path(folder), self.write)


@dataclass
class BuiltKernel(TargetBound):
    """A model's kernel read back from its build folder: the rendered files and launch, ready to compile; the
    program stays as ``rprogram.json`` holds it (a fused operator's op, with its views and packed layouts, is
    not an op file's)."""

    name: str
    target: Target
    artifact: Artifact
    line: str
    predicted_ms: float | None
    program_json: dict[str, Any] | None = None
    _runner: Runner | None = field(default=None, repr=False)

    @property
    def launch(self) -> dict[str, Any]:
        return self.artifact.launch

    @property
    def files(self) -> dict[str, str]:
        return dict(self.artifact.files)

    @property
    def source(self) -> str:
        return self.artifact.source

    @property
    def runner(self) -> Runner:
        """The kernel compiled for this machine's device (on first use)."""
        if self._runner is None:
            require_device(self.target.backend, self.target.hw, why="running a kernel")
            self._runner = self.target.backend.compile(self.artifact, self.target.hw, None)
        return self._runner


def kind_of(folder: Path) -> str:
    """"model", "kernel set", "kernel" or "kernels" (a folder of op folders); InputError for any other folder."""
    if (folder / "plan.json").is_file() and (folder / "model.json").is_file():
        return "model"
    if (folder / "dispatch.json").is_file():
        return "kernel set"
    if all((folder / f).is_file() for f in ("launch.json", "rprogram.json", "report.json")):
        return "kernel"
    subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if folder.is_dir() else []
    if subs and all(kind_of_or_none(p) in ("kernel", "kernel set") for p in subs):
        return "kernels"
    raise InputError("not a folder roller build wrote (no model.json and plan.json, no dispatch.json, no "
                     "report.json with launch.json and rprogram.json)", source=str(folder))


def kind_of_or_none(folder: Path) -> str | None:
    try:
        return kind_of(folder)
    except InputError:
        return None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("missing from the build folder", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err.__class__.__name__}", source=str(path)) from None
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON: {err.msg}", source=str(path), line=err.lineno) from None


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def damaged(path: Path, what: str) -> InputError:
    return InputError(f"damaged build file: {what}", source=str(path))


def write_kernel_files(folder: Path, art: Artifact, prog: Mapping[str, Any] | None) -> list[str]:
    """The backend's files, ``launch.json`` and (where the program is known: ``RProgram.to_json()``)
    ``rprogram.json`` in ``folder`` (made here); the names written."""
    folder.mkdir(parents=True)
    written = []
    for name, text in art.files.items():
        if os.sep in name or "/" in name or name.startswith(".") or name in KERNEL_FILES:
            raise InputError(f"the backend produced a file named {name!r}")  # pragma: no cover - a backend bug
        (folder / name).write_text(text, encoding="utf-8")
        written.append(name)
    write_json(folder / "launch.json", art.launch)
    written.append("launch.json")
    if prog is not None:
        write_json(folder / "rprogram.json", prog)
        written.append("rprogram.json")
    return written


def read_artifact(folder: Path, main_file: str, listed: Any = None) -> Artifact:
    """The rendered kernel of a kernel folder: its ``main_file`` and the other files the backend wrote (those
    ``listed`` where the folder's report lists them: files of an earlier build left beside them are not
    the kernel's)."""
    launch = read_json(folder / "launch.json")
    if not isinstance(launch, dict) or not isinstance(launch.get("kernel"), str) or \
            not isinstance(launch.get("arguments"), list):
        raise damaged(folder / "launch.json", "expected a launch description with 'kernel' and 'arguments'")
    if not main_file or "/" in main_file or os.sep in main_file or main_file.startswith("."):
        raise damaged(folder, f"the kernel's main file is named {main_file!r}")
    files: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in KERNEL_FILES and not path.name.startswith(".") and \
                (not isinstance(listed, list) or path.name in listed):
            try:
                files[path.name] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise InputError(f"cannot read: {err.__class__.__name__}", source=str(path)) from None
    if main_file not in files:
        raise InputError(f"missing from the build folder (the kernel's source, {main_file})",
                         source=str(folder / main_file))
    # The kernel source first, as the backends order them.
    ordered = {main_file: files.pop(main_file), **files}
    return Artifact(launch["kernel"], ordered, launch, main_file=main_file)


def read_program(path: Path, source: Any = None) -> RProgram:
    """``rprogram.json`` read back with its op (``RProgram.from_json``)."""
    from roller.errors import RollerError

    doc = read_json(path)
    try:
        return RProgram.from_json(doc, source)
    except RollerError as err:
        raise damaged(path, f"its op does not load ({err})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise damaged(path, f"not a program of its op ({err.__class__.__name__}: {err})") from None


def target_of(folder: Path, recorded: Mapping[str, Any], backend: str, hw: HwLike | Target | None) -> Target:
    """The target a folder was built for: ``hw`` where given, else the description it records (by its path when
    that file is still there, else by name); refused where the description's content differs from the one the
    kernels were built for (``hash``), which would run them with another machine's assumptions."""
    if hw is None:
        source, name = recorded.get("source"), recorded.get("name")
        if not isinstance(name, str):
            raise damaged(folder, "it records no hardware description")
        hw = source if isinstance(source, str) and Path(source).is_file() else name
    target = Target.resolve(hw, backend)
    want = recorded.get("hash")
    if isinstance(want, str) and want != target.hw.content_hash():
        raise InputError(f"built for a description {recorded.get('name')!r} whose content differs from "
                         f"{target.hw.name!r} ({target.hw.source}); give the description it was built with "
                         "(hw=, --hw)", source=str(folder))
    return target


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def staged_write(folder: Path, write: Callable[[Path], Any]) -> Any:
    """``write(path)`` making a fresh folder beside ``folder``, then each entry it wrote moved into ``folder``,
    replacing an earlier build's entry of that name (other entries are left as they are: ``-o .`` is a folder
    of the user's). A failure while writing leaves the earlier build as it was."""
    if folder.exists() and not folder.is_dir():
        raise InputError("output exists and is not a folder", field="-o", source=str(folder))
    try:
        tmp = staging_dir(folder)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(folder)) from None
    try:
        made = tmp / ".new"   # no entry of a build starts with a dot: none collides with it
        result = _written(folder, write, made)
        names = sorted(p.name for p in made.iterdir())
        for name in names:
            os.rename(made / name, tmp / name)
        made.rmdir()
        move_into_place(tmp, folder, names)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _written(folder: Path, write: Callable[[Path], Any], made: Path) -> Any:
    """``write(made)``; a full disk or a folder that turned read-only is one line naming ``-o`` (the staging
    folder is removed by the caller), not a traceback."""
    try:
        return write(made)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(folder)) from None


def staged_replace(folder: Path, write: Callable[[Path], Any], marker: str) -> Any:
    """``write(path)`` making a fresh folder beside ``folder``, which then becomes ``folder`` in one step (the
    two swapped where the system can; else the old one moved aside, where ``roller.atomic.sweep_stale`` finds
    it after a kill between the two renames): a build killed at any point leaves the earlier build whole or
    the new one, never files of both. ``folder`` must be absent, empty, or an earlier build (it holds
    ``marker``): a folder of other files is refused rather than replaced."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError("output exists and is not a folder", field="-o", source=str(folder))
    if folder.is_dir() and not (folder / marker).is_file() and any(folder.iterdir()):
        raise InputError(f"the folder holds files that are not a build of this kind (no {marker}): a build "
                         "replaces the whole folder, so give a new or empty one", field="-o", source=str(folder))
    try:
        tmp = staging_dir(folder)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(folder)) from None
    try:
        made = tmp / "new"
        result = _written(folder, write, made)
        try:
            if not folder.exists():
                os.rename(made, folder)
            elif not exchange(made, folder):
                aside = Path(f"{tmp}-old")
                os.rename(folder, aside)
                os.rename(made, folder)
                shutil.rmtree(aside, ignore_errors=True)
        except OSError as err:
            raise InputError(f"cannot move the build into place: {err.strerror or err}", field="-o",
                             source=str(folder)) from None
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def move_into_place(tmp: Path, out_dir: Path, names: Sequence[str]) -> None:
    """Rename each finished ``tmp/<name>`` to ``out_dir/<name>``, replacing an earlier build of it: in one step
    where the system can swap two paths, so that a kill between steps never leaves it missing; else moving the
    old one aside first (to ``tmp/.old-<name>``, which ``roller.atomic.sweep_stale`` moves back after a kill
    between the two renames)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        final = out_dir / name
        if final.exists() or final.is_symlink():
            if exchange(tmp / name, final):
                continue
            os.rename(final, tmp / f".old-{name}")
        os.rename(tmp / name, final)
