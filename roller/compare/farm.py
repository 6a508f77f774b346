"""Builds on a Dask cluster: ``roller compare --scheduler tcp://host:port`` (or ``ROLLER_SCHEDULER``).

Each task (one op on one description) runs on a worker of the cluster, which needs this package installed (the
same version: a task is pickled with its code's names); its result (the report's entry, the rendered sources with
it) comes back to the client, which writes the report as it does for a local build, so the two are equal byte
for byte. Dask's scheduler hands the tasks of a worker that dies to the others. A worker without a description's
device or toolchain does what a local build without them does: construction, the model, rendering.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from roller.errors import InputError

T = TypeVar("T")
R = TypeVar("R")

CONNECT_TIMEOUT_S = 10.0


def client_for(scheduler: str) -> Any:
    """A ``distributed.Client`` connected to ``scheduler``; a one-line InputError naming ``--scheduler`` where
    dask.distributed is missing or the scheduler does not answer."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError("--scheduler needs dask.distributed: pip install 'roller[farm]'",
                         field="--scheduler") from None
    if "://" not in scheduler or any(c.isspace() for c in scheduler):
        raise InputError(f"expected a scheduler address such as tcp://host:8786, got {scheduler!r}",
                         field="--scheduler")
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"no Dask scheduler answered at {scheduler} within {CONNECT_TIMEOUT_S:g} s: {first}",
                         field="--scheduler") from None


def run_on_cluster(scheduler: str, fn: Callable[[T], R], tasks: Sequence[T],
                   done: Callable[[int, R], None]) -> None:
    """``fn(task)`` for every task on the cluster at ``scheduler``; ``done(i, result)`` as each comes back.
    The first task that raises ends the run with its exception (the rest are cancelled)."""
    from distributed import as_completed

    with client_for(scheduler) as client:
        futures = client.map(fn, list(tasks), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for future in as_completed(futures, loop=client.loop):
                done(index[future.key], future.result())
        finally:
            client.cancel(futures)
