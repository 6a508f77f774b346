"""Builds on a Dask cluster: ``roller compare --scheduler tcp://host:port`` (or ``ROLLER_SCHEDULER``).

Each task (up to eight ops on one description) runs on a worker of the cluster, which needs this package installed (the
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
#: how long a run waits with work left and no worker at all before it gives up (a worker may be restarting)
NO_WORKER_TIMEOUT_S = 30.0
#: how long a finished task's result may take to arrive (it waits, not hangs, where its worker has died)
RESULT_TIMEOUT_S = 1.0


def client_for(scheduler: str) -> Any:
    """A ``distributed.Client`` connected to ``scheduler``; a one-line InputError naming ``--scheduler`` where
    dask.distributed is missing or the scheduler does not answer."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError("dask.distributed is not installed: pip install 'roller[farm]'",
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


def _code_hash() -> str:
    from roller.cache import code_hash

    return code_hash()


def _worker_count(dask_scheduler: Any) -> int:
    return len(dask_scheduler.workers)


def check_workers(client: Any, scheduler: str) -> None:
    """A one-line InputError where the cluster has no worker (within the connect timeout), or a worker runs
    other Roller code than this client (its entries could differ from a local build's)."""
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise InputError(f"the Dask scheduler at {scheduler} has no workers (none joined within "
                         f"{CONNECT_TIMEOUT_S:g} s)", field="--scheduler") from None
    mine = _code_hash()
    other = sorted(addr for addr, h in client.run(_code_hash).items() if h != mine)
    if other:
        raise InputError(f"the worker at {other[0]} runs other Roller code than this client: install the same "
                         "version on every worker", field="--scheduler")


def run_on_cluster(scheduler: str, fn: Callable[[T], R], tasks: Sequence[T],
                   done: Callable[[int, R], None]) -> None:
    """``fn(task)`` for every task on the cluster at ``scheduler``; ``done(i, result)`` as each comes back.
    The first task that raises ends the run with its exception (the rest are cancelled); a run whose workers
    are all gone for ``NO_WORKER_TIMEOUT_S`` ends with a one-line InputError instead of waiting forever."""
    import time

    with client_for(scheduler) as client:
        check_workers(client, scheduler)
        futures = client.map(fn, list(tasks), pure=False)
        pending = {f: i for i, f in enumerate(futures)}
        alone_since: float | None = None
        asked = 0.0
        try:
            while pending:
                progressed = False
                for future in [f for f in pending if f.status in ("finished", "error", "cancelled")]:
                    try:
                        result = future.result(timeout=RESULT_TIMEOUT_S)
                    except TimeoutError:
                        # Its worker died holding the result: the scheduler computes it again elsewhere.
                        continue
                    done(pending.pop(future), result)
                    progressed = True
                if progressed:
                    alone_since = None
                    continue
                time.sleep(0.05)
                if time.monotonic() - asked < 1.0:
                    continue
                asked = time.monotonic()   # the scheduler is asked (the client's copy lags), once a second
                if client.run_on_scheduler(_worker_count):
                    alone_since = None
                    continue
                alone_since = alone_since or time.monotonic()
                if time.monotonic() - alone_since > NO_WORKER_TIMEOUT_S:
                    raise InputError(f"every worker of the Dask scheduler at {scheduler} is gone, with "
                                     f"{len(pending)} of {len(futures)} tasks left", field="--scheduler")
        finally:
            client.cancel(futures)
