"""Whole-model latency on this machine's OpenCL device against onnxruntime, in the same process.

    .venv/bin/python bench/models.py [--models resnet18 mobilenet_v2 bert_base_layer] [--rounds 5] [--json OUT]

For each model of the zoo (``bench/zoo``, exported to ``~/.cache/roller/zoo`` by ``python -m bench.zoo``):
compile time cold (a fresh kernel cache and a fresh PoCL cache, in a child process) and warm (this process's
cache, second compile), kernels launched and built, device copies, peak device memory; then latency of Roller's
executor (device work of one run: inputs already uploaded) and of onnxruntime (graph optimisations on, 2
intra-op threads, the run call), alternating, ``--rounds`` rounds of ``--repeat`` runs each, medians; outputs
checked against onnxruntime first. The same model compiled without fusion (``fuse="none"``, one kernel per
operator), with the rule-based fusion pass instead of the solver (``fuse="greedy"``) and with every image in
its model's layout (``ROLLER_BLOCK_CHANNELS=0``: no channels stored in blocks) is timed in the same rounds, and
so is OpenVINO's CPU plugin on the same file (2 inference threads, the latency hint) where
``openvino`` is installed (an optional bench dependency: ``pip install 'roller[bench]'``). Prints a markdown
table; ``--json`` writes every number.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = ("resnet18", "mobilenet_v2", "bert_base_layer")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cold_compile(path: Path, hw: str) -> float:
    """Seconds to compile the model in a child process with empty Roller and PoCL caches."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as pocl:
        env = dict(os.environ, ROLLER_CACHE_DIR=cache, POCL_CACHE_DIR=pocl)
        code = ("import sys, time, roller; t = time.perf_counter(); "
                f"roller.compile_model({str(path)!r}, hw={hw!r}).executor; "
                "print(time.perf_counter() - t)")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])


def compile_twice(model: Any, hw: str) -> tuple[Any, float, float]:
    """The model compiled with this process's kernel cache as it is, then again (warm): the compiled model and
    both wall times, each with its executor set up (buffers allocated, weights uploaded)."""
    import roller

    times = []
    for _ in range(2):
        t = time.perf_counter()
        m = roller.compile_model(model, hw=hw)
        _ = m.executor
        times.append(time.perf_counter() - t)
    return m, times[0], times[1]


def alternate(ours: Any, theirs: Any, rounds: int, repeat: int) -> tuple[list[float], list[float]]:
    """Each round's median seconds of ``repeat`` calls of each function, which goes first alternating by round
    (these machines are noisy: a ratio holds only between runs made side by side)."""
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        jobs = [(times[0], ours), (times[1], theirs)]
        for out, fn in jobs[r % 2:] + jobs[:r % 2]:
            once = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                once.append(time.perf_counter() - t)
            out.append(statistics.median(once))
    return times


#: seconds left after onnxruntime's runs before the next job: its intra-op threads spin-wait after a run
ORT_SETTLE_S = 0.2


def round_order(jobs: list[Any], r: int) -> list[Any]:
    """The order of round ``r``: a permutation of its own (seeded by the round), so that no job always follows
    the same one (a rotation keeps the cyclic order: the job after onnxruntime was the same every round)."""
    import random

    return random.Random(r).sample(jobs, len(jobs))


def ort_session(path: Path | bytes) -> Any:
    """onnxruntime on the model at ``path`` (or serialised in it): 2 threads, every graph optimisation."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts,
                                providers=["CPUExecutionProvider"])


def openvino_model(path: Path) -> Any:
    """OpenVINO's CPU plugin compiled for the model at ``path`` (2 threads, latency hint: one request at a
    time, as the other runs here; float32 arithmetic: on a CPU with AVX-512 BF16 its default computes in
    bfloat16, which gave ResNet-50's logits errors of 18 here), or None where openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    return ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY",
                                                      "INFERENCE_PRECISION_HINT": "f32"})


def unblocked_model(path: Path, hw: str) -> Any:
    """The model built with every image in its own layout (no channels in blocks: roller.graph.blocking)."""
    import roller

    before = os.environ.get("ROLLER_BLOCK_CHANNELS")
    os.environ["ROLLER_BLOCK_CHANNELS"] = "0"
    try:
        return roller.compile_model(path, hw=hw)
    finally:
        if before is None:
            del os.environ["ROLLER_BLOCK_CHANNELS"]
        else:
            os.environ["ROLLER_BLOCK_CHANNELS"] = before


def measure(name: str, hw: str, rounds: int, repeat: int, cold: bool, evaluate: bool = False) -> dict[str, Any]:
    import roller
    from bench.zoo import SPECS, default_dir

    path = default_dir() / f"{name}.onnx"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run .venv/bin/python -m bench.zoo --models {name}")
    feeds = SPECS[name].example_inputs()
    row: dict[str, Any] = {"model": name, "hw": hw}
    if cold:
        row["compile_cold_s"] = cold_compile(path, hw)
    m, row["compile_first_s"], row["compile_warm_s"] = compile_twice(path, hw)
    row.update(m.summary())
    row["model"] = name   # the zoo's name, not the exported graph's ("main_graph")
    check = m.check(feeds)
    row["max_abs_error"] = max(check["max_abs_error"].values())
    sess = ort_session(path)
    vino = openvino_model(path)
    if vino is not None:
        import openvino as ov

        row["openvino"] = ov.__version__
        want = sess.run(None, feeds)[0]
        got = vino(feeds)[0]
        row["max_abs_error_openvino"] = float(abs(got - want).max())
    unfused = roller.compile_model(path, hw=hw, fuse="none")
    greedy = roller.compile_model(path, hw=hw, fuse="greedy")
    unblocked = unblocked_model(path, hw)
    timed = None
    if evaluate:
        # Every kernel's top-10 timed on this device (roller.compile_model(evaluate=True)): the build a user
        # with the device at hand gets, timed in the same rounds.
        t = time.perf_counter()
        timed = roller.compile_model(path, hw=hw, evaluate=True, progress=False)
        _ = timed.executor
        row["compile_evaluated_s"] = time.perf_counter() - t
        row["max_abs_error_evaluated"] = max(timed.check(feeds)["max_abs_error"].values())
    row["kernels_launched_unfused"] = len(unfused.kernels)
    row["kernels_launched_greedy"] = len(greedy.kernels)
    row["max_abs_error_unfused"] = max(unfused.check(feeds)["max_abs_error"].values())
    row["max_abs_error_greedy"] = max(greedy.check(feeds)["max_abs_error"].values())
    row["fusion_greedy"] = greedy.summary()["fusion"]
    row["max_abs_error_unblocked"] = max(unblocked.check(feeds)["max_abs_error"].values())
    row["blocked_values"] = sum(1 for v in m.stages.blocked.values if v not in m.stages.fused.values
                                and v not in m.stages.blocked.constants)
    ours: list[float] = []
    layout: list[float] = []
    plain: list[float] = []
    rule: list[float] = []
    theirs: list[float] = []
    measured: list[float] = []
    vino_times: list[float] = []
    for variant in (m, unfused, greedy, unblocked, *([timed] if timed is not None else [])):
        variant.executor.run(feeds)
    for _ in range(2):
        sess.run(None, feeds)
    def anchor(run: Callable[[], Any]) -> Callable[[], float]:
        """The median seconds of ``repeat`` calls of another runtime's ``run``, then a pause: its threads spin a
        while after a run, and whatever ran next shared the cores with them."""
        def timed() -> float:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            time.sleep(ORT_SETTLE_S)
            return statistics.median(times)
        return timed

    def roller_run(variant: Any) -> Callable[[], float]:
        return lambda: statistics.median(variant.executor.time(feeds, repeat=repeat, warmup=1))

    if vino is not None:
        for _ in range(2):
            vino(feeds)
    jobs: list[tuple[list[float], Callable[[], float]]] = [(ours, roller_run(m)), (plain, roller_run(unfused)),
                                                           (rule, roller_run(greedy)), (layout, roller_run(unblocked))]
    if timed is not None:
        jobs.append((measured, roller_run(timed)))
    jobs.append((theirs, anchor(lambda: sess.run(None, feeds))))
    if vino is not None:
        jobs.append((vino_times, anchor(lambda: vino(feeds))))
    for r in range(rounds):
        # Each round runs the variants in another order, and the other runtimes' threads are left to settle after
        # their runs (the solver's build, once always first, ran 3-20% slower than the greedy pass's identical
        # kernels; rotating the order kept it right after onnxruntime in every round but the first:
        # EfficientNet-B0 16.1 against 11.3 ms).
        for out, run in round_order(jobs, r):
            out.append(run())
    row["roller_ms"] = statistics.median(ours) * 1e3
    row["ort_ms"] = statistics.median(theirs) * 1e3
    row["unfused_ms"] = statistics.median(plain) * 1e3
    row["greedy_ms"] = statistics.median(rule) * 1e3
    row["unblocked_ms"] = statistics.median(layout) * 1e3
    row["unblocked_rounds_ms"] = [x * 1e3 for x in layout]
    row["greedy_rounds_ms"] = [x * 1e3 for x in rule]
    row["unfused_rounds_ms"] = [x * 1e3 for x in plain]
    row["roller_rounds_ms"] = [x * 1e3 for x in ours]
    row["ort_rounds_ms"] = [x * 1e3 for x in theirs]
    row["slowdown"] = row["roller_ms"] / row["ort_ms"]
    if vino_times:
        row["openvino_ms"] = statistics.median(vino_times) * 1e3
        row["openvino_rounds_ms"] = [x * 1e3 for x in vino_times]
    if measured:
        row["evaluated_ms"] = statistics.median(measured) * 1e3
        row["evaluated_rounds_ms"] = [x * 1e3 for x in measured]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(DEFAULT))
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold compile (a child process)")
    ap.add_argument("--json", default=None, metavar="OUT")
    ap.add_argument("--eval", dest="evaluate", action="store_true",
                    help="also the model built with every kernel's top-10 timed (compile_model(evaluate=True))")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    rows = [measure(n, args.hw, args.rounds, args.repeat, args.cold, args.evaluate) for n in args.models]
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); onnxruntime {ort.__version__}, 2 threads; "
          f"Roller on {args.hw}")
    print("| model | Roller ms (fused) | unfused ms | onnxruntime ms | fused / ORT | unfused / ORT | launches fused "
          "(unfused) | kernels built | fusion pass s | compile cold s | warm s | copies | peak MiB | max abs err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['roller_ms']:.1f} | {r['unfused_ms']:.1f} | {r['ort_ms']:.1f} | "
              f"{r['slowdown']:.2f}x | {r['unfused_ms'] / r['ort_ms']:.2f}x | {r['kernels_launched']} "
              f"({r['kernels_launched_unfused']}) | {r['kernels_built']} | {r['fusion']['seconds']:.2f} | "
              f"{r.get('compile_cold_s', float('nan')):.1f} | {r['compile_warm_s']:.2f} | {r['copies']} | "
              f"{r['peak_bytes'] / 2**20:.1f} | {r['max_abs_error']:.2g} |")
    print()
    print("| model | solver: kernels, predicted ms, measured ms | greedy: kernels, predicted ms, measured ms | "
          "solver candidates | solver s | greedy s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        fs, fg = r["fusion"], r["fusion_greedy"]
        print(f"| {r['model']} | {fs['kernels_after']}, {fs['predicted_s'] * 1e3:.2f}, {r['roller_ms']:.1f} | "
              f"{fg['kernels_after']}, {fg['predicted_s'] * 1e3:.2f}, {r['greedy_ms']:.1f} | {fs['candidates']} | "
              f"{fs['seconds']:.2f} | {fg['seconds']:.2f} |")
    geo = statistics.geometric_mean([r["slowdown"] for r in rows])
    print(f"geomean Roller / onnxruntime: {geo:.2f}x fused, "
          f"{statistics.geometric_mean([r['unfused_ms'] / r['ort_ms'] for r in rows]):.2f}x unfused")
    if all("openvino_ms" in r for r in rows):
        print("| model | OpenVINO ms | OpenVINO / ORT | Roller / OpenVINO | OpenVINO max abs err |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['openvino_ms']:.1f} | {r['openvino_ms'] / r['ort_ms']:.2f}x | "
                  f"{r['roller_ms'] / r['openvino_ms']:.2f}x | {r['max_abs_error_openvino']:.2g} |")
        vino_geo = statistics.geometric_mean([r["openvino_ms"] / r["ort_ms"] for r in rows])
        print(f"geomean OpenVINO / onnxruntime: {vino_geo:.2f}x")
    if args.evaluate:
        print()
        print("| model | fused, top-10 timed, ms | / ORT | build s | max abs err |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['evaluated_ms']:.1f} | {r['evaluated_ms'] / r['ort_ms']:.2f}x | "
                  f"{r['compile_evaluated_s']:.0f} | {r['max_abs_error_evaluated']:.2g} |")
        ev = statistics.geometric_mean([r["evaluated_ms"] / r["ort_ms"] for r in rows])
        print(f"geomean Roller (top-10 timed) / onnxruntime: {ev:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
