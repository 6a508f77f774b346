"""What a build is for: a hardware description and the backend that renders for it, resolved once.

A ``Target`` is resolved from a description's name, a YAML path, a ``HardwareDesc``, or a name a backend
measures on this machine (``host``), with an optional backend name (``--backend``; default: the one serving the
description). It carries what every stage asks of the pair: the backend's matrix support (construction offers
only programs the backend renders), its cache environment, and construction itself as a shared value:
``target.programs(expr, top_k)`` is memoised by the expression's content, so that fusion costing, the padding
decision, the layout choice and the build ask construction once for the same question.
"""
from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller import backends as _backends
from roller.backends import Backend
from roller.errors import InputError
from roller.hw import HardwareDesc, list_bundled
from roller.hw import load as load_hw
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

HwLike = str | os.PathLike | HardwareDesc


def local_names() -> list[str]:
    """Names of the descriptions measured on this machine the first time they are used (``--hw host``): the
    backends declare them."""
    return sorted(n for b in _backends.registry().values() for n in b.local_names)


def _local_files() -> dict[str, Callable[[], Path]]:
    # Each name's file is measured (probed) only when that name is loaded.
    return {n: functools.partial(b.local_description, n) for b in _backends.registry().values()
            for n in b.local_names}


def load_description(hw: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> HardwareDesc:
    """A description by bundled name, path, or a name measured here; InputError (exit 2) on any problem."""
    return load_hw(hw, overrides=overrides, local=_local_files())


def default_hw() -> str:
    """The description a build gets where none is named: this machine's own, measured the first time and cached
    (the first name a backend that runs here measures: ``host``, the OpenCL device), so that kernels are built
    for the CPU a user has rather than for the bundled ``pocl-cpu``'s AVX-512 EPYC. Without such a device, the
    error that lists the names a build could have had."""
    for b in _backends.registry().values():
        if b.local_names and b.can_run_here():
            return b.local_names[0]
    raise missing_hw("no description named, and no device here to measure one")


def missing_hw(what: str) -> InputError:
    """The error for a build given no description: the names it could have had."""
    local = f"; measured here: {', '.join(local_names())}" if local_names() else ""
    return InputError(f"{what} (bundled: " + ", ".join(list_bundled()) + local + ")")


@dataclass(frozen=True, eq=False)
class Target:
    """A description and the backend that renders for it; construction's answers for it, memoised."""

    hw: HardwareDesc
    backend: Backend
    # (content hash, top_k[, op name]) -> programs; the short key answers questions that ignore the name
    _programs: dict[tuple[Any, ...], list[RProgram]] = field(default_factory=dict, repr=False)
    _locks: dict[tuple[str, int], threading.Lock] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def resolve(cls, hw: HwLike | Target | None, backend: str | None = None,
                overrides: Mapping[str, Any] | None = None) -> Target:
        """The target of a description (name, path, HardwareDesc or ``host``; None: ``default_hw``) and a backend
        name (default: the description's own); a Target given is returned as it is when no other backend is
        asked for."""
        if isinstance(hw, Target):
            if overrides:
                raise InputError("overrides apply to a description loaded by name or path, not to a Target")
            if backend is None or backend == hw.backend.name:
                return hw
            return cls(hw.hw, _backends.for_hw(hw.hw, backend))
        if hw is None:
            hw = default_hw()
        if isinstance(hw, HardwareDesc):
            if overrides:
                raise InputError("overrides apply to a description loaded by name or path, not to a HardwareDesc")
            desc = hw
        else:
            desc = load_description(hw, overrides)
        return cls(desc, _backends.for_hw(desc, backend))

    @property
    def name(self) -> str:
        return f"{self.hw.name}/{self.backend.name}"

    @property
    def matrix_support(self) -> tuple[Any, ...]:
        return tuple(self.backend.matrix_support)

    @property
    def cache_env(self) -> tuple[str, ...]:
        return tuple(self.backend.cache_env)

    def __repr__(self) -> str:
        return f"<roller.Target {self.name}>"

    def programs(self, expr: TensorExpr, top_k: int) -> list[RProgram]:
        """Construction's ``top_k`` programs of ``expr``, best predicted first, constructed the first time this
        target is asked for them. Rendering names the kernel after the op, so the programs are ``expr``'s own
        (an op of the same content under another name is constructed again)."""
        return list(self._answer(expr, top_k, by_name=True))

    def best(self, expr: TensorExpr) -> RProgram:
        """The program the model predicts fastest (the top-1 construction), for decisions that weigh programs
        (fusion, padding, layouts): shared by every operator of the same content, whatever its name, so that
        its ``expr`` may carry another op's name."""
        return self._answer(expr, 1, by_name=False)[0]

    def predicted_seconds(self, expr: TensorExpr) -> float:
        """``expr``'s time as its best program is predicted to take (infinite where no prediction exists)."""
        pred = self.best(expr).prediction
        return pred.time_s if pred is not None else float("inf")

    def _answer(self, expr: TensorExpr, top_k: int, by_name: bool) -> list[RProgram]:
        from roller.construction import construct

        content = (expr.content_hash(), top_k)
        key = content + ((expr.name,) if by_name else ())
        with self._lock:
            found = self._programs.get(key)
            if found is not None:
                return found
            lock = self._locks.setdefault(content, threading.Lock())
        # One lock per question: builder threads asking the same one wait for the first answer.
        with lock:
            with self._lock:
                found = self._programs.get(key)
            if found is None:
                found = self._stored(expr, top_k)
            if found is None:
                found = construct(expr, self.hw, top_k=top_k, matrix=self.matrix_support,
                                  split_k=self.backend.split_k, vectors=self.backend.vector_programs)
                self._store(expr, top_k, found)
                with self._lock:
                    self._programs[content + (expr.name,)] = found
                    self._programs.setdefault(content, found)
        return found

    # Construction's answers kept in the kernel cache across processes: a warm build of a model asks for tens to
    # hundreds of them (fusion costs its candidates, padding and layouts weigh theirs), each 10-100 ms.
    def _stored_key(self, expr: TensorExpr, top_k: int) -> str:
        from roller import cache

        return cache.result_key("construct", expr.content_hash(), str(top_k), self.hw.content_hash(),
                                self.backend.name, repr(self.matrix_support), cache.code_hash())

    def _stored(self, expr: TensorExpr, top_k: int) -> list[RProgram] | None:
        """The programs an earlier process constructed for ``expr``, read back onto ``expr`` itself (so that
        they carry its name), or None: absent, or not a consistent program of it (then constructed again)."""
        from roller import cache

        if expr.source is not None:   # a prepared expression: construction starts from the op as written
            return None
        docs = cache.load_result("construct", self._stored_key(expr, top_k))
        if not isinstance(docs, list) or not docs:
            return None
        try:
            return [RProgram.from_json(d, expr) for d in docs]
        except (ValueError, KeyError, TypeError):
            return None

    def _store(self, expr: TensorExpr, top_k: int, programs: list[RProgram]) -> None:
        from roller import cache

        if expr.source is None and programs:
            cache.store_result("construct", self._stored_key(expr, top_k), [p.to_json() for p in programs])


class StoredCosts:
    """``target.predicted_seconds`` for the operators one graph's fusion weighs, kept in the cache as one table
    (content hash -> seconds) per graph: a warm build's fusion of ResNet-50 read 948 stored constructions, 0.6
    of its 0.8 s, to use one number of each. ``save`` stores the table where a question was new."""

    def __init__(self, target: Target, graph_key: str) -> None:
        from roller import cache

        self.target = target
        self.key = cache.result_key("fusion-costs", graph_key, target.hw.content_hash(), target.backend.name,
                                    repr(target.matrix_support), cache.code_hash())
        found = cache.load_result("fusion-costs", self.key)
        self.table: dict[str, float | None] = found if isinstance(found, dict) else {}
        self.new = False

    def __call__(self, expr: TensorExpr) -> float:
        h = expr.content_hash()
        if h in self.table:
            got = self.table[h]
            return float("inf") if got is None else float(got)
        value = self.target.predicted_seconds(expr)
        self.table[h] = value if math.isfinite(value) else None   # JSON has no infinity
        self.new = True
        return value

    def save(self) -> None:
        from roller import cache

        if self.new:
            cache.store_result("fusion-costs", self.key, self.table)
            self.new = False


class TargetBound:
    """What is built for a target (a kernel, a kernel set, a model) answers for its description and backend."""

    target: Target

    @property
    def hw(self) -> HardwareDesc:
        return self.target.hw

    @property
    def backend(self) -> Backend:
        return self.target.backend
