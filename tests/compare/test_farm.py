"""``roller compare`` on a Dask cluster (``roller.compare.farm``): a real ``dask scheduler`` and two ``dask
worker`` processes on localhost, started here; one worker is killed mid-run, and what comes back equals a local
build byte for byte."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed", reason="the farm tests need dask.distributed (the dev extra)")

from roller.compare import collect, farm
from roller.compare.farm import client_for
from roller.errors import InputError
from roller.hw import load as load_hw

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"mini_resnet": None, "mini_bert": None, "mini_gpt2": ["input_ids=1,12", "attention_mask=1,12"]}
DESCRIPTIONS = ["pocl-cpu", "h100", "mi50"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]


def _wait_for_workers(address: str, n: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while True:   # the scheduler itself may take a moment to listen
        try:
            client = client_for(address)
            break
        except InputError:
            if time.monotonic() > end:
                raise
    with client:
        while len(client.scheduler_info()["workers"]) < n:
            if time.monotonic() > end:
                raise RuntimeError(f"{n} workers did not join {address} in {timeout:g} s")
            time.sleep(0.2)


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Any]:
    """A function that starts a real ``dask scheduler`` and ``workers`` ``dask worker`` processes on localhost
    (importing Roller from ``code``) and returns them; all are ended after the test."""
    dask = str(Path(sys.executable).parent / "dask")
    procs: list[subprocess.Popen[bytes]] = []

    def start(workers: int = 2, code: Path = ROOT) -> Cluster:
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(code)}
        logs = tmp_path / f"logs-{port}"
        logs.mkdir()

        def run(name: str, *args: str) -> subprocess.Popen[bytes]:
            with open(logs / f"{name}.log", "wb") as log:
                p = subprocess.Popen([dask, *args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
            procs.append(p)
            return p

        sched = run("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")
        # --no-nanny: a worker is one process, so that a SIGKILL ends it for good (a nanny would restart it).
        started = [run(f"worker{i}", "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                       "--name", f"w{i}") for i in range(workers)]
        _wait_for_workers(address, workers)
        return Cluster(address, sched, started)

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


@pytest.fixture
def cluster(start_cluster: Any) -> Cluster:
    return start_cluster()  # type: ignore[no-any-return]


def _processing(address: str, name: str, wait_s: float = 2.0) -> int:
    """How many tasks the worker named ``name`` is running, as soon as it runs one (within ``wait_s``)."""
    end = time.monotonic() + wait_s
    with client_for(address) as client:
        addr = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name)
        while True:
            n = len(client.processing(workers=[addr]).get(addr, ()))
            if n or time.monotonic() > end:
                return n
            time.sleep(0.01)


def zoo_ops() -> list[Any]:
    """The distinct operators of three small models (a ResNet, a BERT, a GPT-2), named apart."""
    from roller.cli.model_cmd import model_ops
    from roller.compiler.inputs import as_model

    ops = []
    for name, shapes in MODELS.items():
        found, _ = model_ops(as_model(str(ROOT / "examples" / "models" / f"{name}.onnx")), shapes)
        ops += [dataclasses.replace(op, name=f"{name}_{op.name}") for op in found]
    return ops


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_zoo_on_two_workers_survives_a_killed_worker_and_equals_a_local_build(cluster: Cluster,
                                                                                 tmp_path: Path) -> None:
    ops = zoo_ops()
    hws = [load_hw(h) for h in DESCRIPTIONS]
    steps: list[int] = []

    busy: list[int] = []

    def on_step(n: int, note: str) -> None:
        steps.append(n)
        if len(steps) == 1:   # the first result is in and most of the work is not: end one worker mid-task
            busy.append(_processing(cluster.address, "w0"))
            cluster.workers[0].send_signal(signal.SIGKILL)

    remote = collect.collect(ops, hws, top_k=4, codegen=True, kernels_dir=tmp_path / "remote", jobs=1,
                             on_step=on_step, scheduler=cluster.address)
    assert cluster.workers[0].wait(timeout=10) == -signal.SIGKILL
    with client_for(cluster.address) as client:
        assert [w["name"] for w in client.scheduler_info()["workers"].values()] == ["w1"]
    assert busy and busy[0] >= 1   # it held a task when it died: another worker did that one again
    assert sum(steps) == len(ops) * len(hws) and len(steps) > 2

    local = collect.collect(ops, hws, top_k=4, codegen=True, kernels_dir=tmp_path / "local", jobs=1)
    assert collect.without_timings(remote) == collect.without_timings(local)
    got, want = tree(tmp_path / "remote"), tree(tmp_path / "local")
    assert len(want) >= len(ops) * len(hws) and got == want


def test_the_command_takes_the_scheduler_from_the_environment(cluster: Cluster, tmp_path: Path) -> None:
    env = {**os.environ, "ROLLER_SCHEDULER": cluster.address}
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "roller", "compare", str(ROOT / "examples" / "matmul.json"),
                          "--hw", "pocl-cpu", "--hw", "h100", "--no-plots", "-o", str(out)],
                         check=False, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    with client_for(cluster.address) as client:   # the workers did the builds: the scheduler kept their record
        assert any("run_job" in str(key) for key in client.run_on_scheduler(_task_names))
    rows = json.loads((out / "results.json").read_text())["results"]
    assert {r["hw"] for r in rows} == {"pocl-cpu", "h100"}


def _task_names(dask_scheduler: Any) -> list[str]:
    return [str(k) for k in dask_scheduler.task_prefixes]


@pytest.mark.parametrize(("address", "message"), [
    ("localhost:8786", "expected a scheduler address such as tcp://host:8786"),
    ("tcp://127.0.0.1:{port}", "no Dask scheduler answered at tcp://127.0.0.1:"),
])
def test_a_scheduler_that_is_not_there_is_a_one_line_error(address: str, message: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "roller", "compare", str(ROOT / "examples" / "matmul.json"),
                          "--hw", "pocl-cpu", "--no-plots", "-o", str(tmp_path / "r"),
                          "--scheduler", address.format(port=free_port())],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == InputError.exit_code
    assert message in run.stderr and "--scheduler" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_run_whose_workers_are_all_gone_ends_with_a_one_line_error(cluster: Cluster,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(farm, "NO_WORKER_TIMEOUT_S", 2.0)
    ops = zoo_ops()

    def on_step(n: int, note: str) -> None:
        for w in cluster.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGKILL)

    with pytest.raises(InputError, match=r"every worker of the Dask scheduler at tcp://.* is gone, with \d+ of"):
        collect.collect(ops, [load_hw("pocl-cpu")], top_k=2, codegen=False, kernels_dir=None, jobs=1,
                        on_step=on_step, scheduler=cluster.address)


def test_a_scheduler_without_workers_is_a_one_line_error(start_cluster: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(farm, "CONNECT_TIMEOUT_S", 1.0)
    empty = start_cluster(workers=0)
    with pytest.raises(InputError, match="has no workers"):
        collect.collect(zoo_ops()[:2], [load_hw("pocl-cpu")], top_k=2, codegen=False, kernels_dir=None, jobs=1,
                        scheduler=empty.address)


def test_a_worker_with_other_roller_code_is_refused(start_cluster: Any, tmp_path: Path) -> None:
    # A worker importing a copy of the package with one comment more: its kernels could differ unseen.
    other = tmp_path / "other"
    shutil.copytree(ROOT / "roller", other / "roller", ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "roller" / "program.py", "a") as f:
        f.write("# a line this client does not have\n")
    odd = start_cluster(workers=1, code=other)
    with pytest.raises(InputError, match="runs other Roller code than this client"):
        collect.collect(zoo_ops()[:2], [load_hw("pocl-cpu")], top_k=2, codegen=False, kernels_dir=None, jobs=1,
                        scheduler=odd.address)
