"""The GPU checks beyond bench/gpu.py, for a session with a lent GPU and little time on it.

    python bench/gpu_checks.py skeletons --out DIR      # here: the zoo's models as graphs and weight statistics
    python bench/gpu_checks.py precompile --skeletons DIR   # here: their kernels compiled for --hw's target
    python bench/gpu_checks.py sample                   # GPU: a few ops' top-3, once each, checked
    python bench/gpu_checks.py dynamic --json F         # GPU: kernel sets over an open size, checked per size
    python bench/gpu_checks.py models --skeletons DIR --json F   # GPU: whole models against onnxruntime
    python bench/gpu_checks.py ranking --results F     # here: the model's ranking of a GPU run's measured top-10

``sample`` is small so that it runs under ``compute-sanitizer`` (memcheck, racecheck) in seconds. A skeleton is
a zoo model (``python -m bench.zoo``) saved with its weights as external data and the data left behind (the
weights of ResNet-18 alone are 46 MB, more than travels to a lent GPU with the compiled kernels); ``models``
fills each weight with normal values of the original's mean and deviation, so that activations keep their scale,
and checks the model on the GPU against onnxruntime on the same weights. Kernels compiled here
(``precompile``, with the same ``ROLLER_CACHE_DIR`` carried) load there without a compiler run.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

import roller
import roller.backends
import roller.hw
from roller.atomic import write_atomic

MODELS = ("resnet18", "mobilenet_v2", "bert_base_layer")
WEIGHTS = "weights.bin"
#: the sample run under compute-sanitizer: scaled-suite ops of every kind with shared-memory staging or not
SAMPLE = ("s_matmul_prime", "s_matmul_ta", "s_bmm_b1", "s_conv3x3_same", "s_conv3x3_s2_same", "s_dw5x5_s2",
          "s_avgpool3x3_s2_same", "s_maxpool3x3_s2_same", "s_reduce_sum_last", "s_reduce_max_multi",
          "s_transpose_nhwc", "s_add_bias", "s_matmul_prime_f16", "s_conv3x3_same_f16")
#: kernel sets over an open size: runtime extents (attention at BERT-base's head size) and a prefix grid (matmul)
DYNAMIC: dict[str, tuple[dict, tuple[int, ...]]] = {
    "scores": ({"name": "scores", "expr": "Y[h,q,k] += Q[q,h,d] * K[h,d,k]",
                "shapes": {"Q": ["s", 12, 64], "K": [12, 64, "s"]}, "symbols": {"s": [1, 512]}}, (1, 17, 128, 384, 512)),
    "context": ({"name": "context", "expr": "Y[q,h,d] += P[h,q,k] * V[k,h,d]",
                 "shapes": {"P": [12, "s", "s"], "V": ["s", 12, 64]}, "symbols": {"s": [1, 512]}}, (1, 17, 128, 512)),
    "softmax": ({"name": "softmax",
                 "expr": "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
                 "shapes": {"X": [768, "c"]}, "symbols": {"c": [1, 512]}}, (1, 5, 129, 512)),
    "key_transpose": ({"name": "kt", "expr": "Y[h,d,k] = K[k,h,d]", "shapes": {"K": ["s", 12, 64]},
                       "symbols": {"s": [1, 512]}}, (1, 33, 512)),
    "matmul_m": ({"name": "mm", "expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": ["m", 768], "B": [768, 3072]},
                  "symbols": {"m": [1, 4096]}}, (1, 7, 64, 300, 1000, 4096)),
}


def _bench_gpu() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench/gpu.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_gpu"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


# -- here: skeletons and their kernels --------------------------------------------------------------------------

def skeletons(out: Path) -> None:
    """Each zoo model (``python -m bench.zoo``) as a skeleton in ``out``."""
    from bench.zoo import default_dir

    for name in MODELS:
        n = skeleton(default_dir() / f"{name}.onnx", out)
        print(f"{name}: {n} weights described", file=sys.stderr)


def skeleton(model_path: Path, out: Path) -> int:
    """The model as ``<stem>.onnx`` in ``out`` (graph; float32 weights of 1 KiB or more external, their data not
    written) and ``<stem>.json`` (each such weight's mean and deviation); the number of weights described."""
    import onnx
    from onnx import numpy_helper

    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(model_path)
    stats = {}
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.nbytes >= 1024:
            stats[init.name] = [float(a.mean()), float(a.std())]
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save_model(model, Path(tmp) / model_path.name, save_as_external_data=True,
                        all_tensors_to_one_file=True, location=WEIGHTS, size_threshold=1024)
        write_atomic(out / model_path.name, (Path(tmp) / model_path.name).read_bytes())
    write_atomic((out / model_path.name).with_suffix(".json"), json.dumps(stats).encode())
    return len(stats)


def restored(skeleton: Path, folder: Path) -> Path:
    """The skeleton's model with every external weight drawn from a normal of its recorded mean and deviation
    (seed 0), written into ``folder``."""
    import onnx

    model = onnx.load(skeleton, load_external_data=False)
    stats = json.loads(skeleton.with_suffix(".json").read_text())
    rng = np.random.default_rng(0)
    places = [(init.name, {e.key: int(e.value) for e in init.external_data if e.key in ("offset", "length")})
              for init in model.graph.initializer if init.external_data]
    data = bytearray(max((p["offset"] + p["length"] for _, p in places), default=0))  # offsets may leave gaps
    for name, p in places:
        mean, std = stats[name]
        n = p["length"] // 4
        data[p["offset"]:p["offset"] + 4 * n] = rng.normal(mean, std, n).astype(np.float32).tobytes()
    (folder / WEIGHTS).write_bytes(bytes(data))
    (folder / "graph.onnx").write_bytes(skeleton.read_bytes())
    whole = onnx.load(folder / "graph.onnx")   # the weights read back in: one self-contained file
    path = folder / skeleton.name
    onnx.save_model(whole, path)
    return path


def precompile(skel: Path, hw_name: str, jobs: int) -> None:
    """What ``models`` and ``dynamic`` build without the device (each skeleton's kernels, each DYNAMIC op's set
    chosen by the model and its exact top-1 at every size) compiled for ``hw_name``'s target."""
    hw = roller.hw.load(hw_name)
    gpu = _bench_gpu()

    def compiled(name: str, arts: list[Any]) -> None:
        errors = gpu.compile_artifacts(arts, hw.target, jobs)
        print(f"{name}: {len(arts)} kernels for {hw.target}" + (f", {len(errors)} failed: {errors[0]}" if errors
              else ""), file=sys.stderr, flush=True)

    for name in MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            m = roller.compile_model(restored(skel / f"{name}.onnx", Path(tmp)), hw=hw, progress=False)
        compiled(name, [k.artifact for k in m.by_key.values()])
    for name, (doc, sizes) in DYNAMIC.items():
        k = roller.compile(doc, hw=hw)
        symbol = next(iter(doc["symbols"]))
        compiled(name, list(k.artifacts) + [roller.compile(k.op.instantiate({symbol: v}), hw=hw).artifact
                                            for v in sizes])


# -- on the GPU -------------------------------------------------------------------------------------------------

def sample(hw_name: str, backend: str, suite: str | None = None) -> int:
    """The SAMPLE ops' top-3 (or every op of ``suite``'s top-3), each launched once and checked: what
    compute-sanitizer runs."""
    from roller.backends import get
    from roller.compiler.check import check_against
    from roller.errors import CheckError
    from roller.ir.reference import random_inputs

    gpu = _bench_gpu()
    hw, be = roller.hw.load(hw_name), get(backend)
    ops = {o["name"]: o for o, _ in gpu.select_ops(suite or "scaled", None, suite is None, 8.0, 200.0)}
    names = SAMPLE if suite is None else tuple(ops)
    bad = 0
    for name in names:
        expr, progs = gpu.candidates(ops[name], hw, be, 3)
        x = random_inputs(expr, seed=0)
        for prog in progs:
            y = be.compile(be.render(prog, hw), hw)([x[t.name] for t in expr.inputs])
            try:
                check_against(name, expr, x, y)
                print(f"{name} {prog.line()}: ok", flush=True)
            except CheckError as err:
                bad += 1
                print(f"{name} {prog.line()}: FAIL {str(err).splitlines()[0]}", flush=True)
    return 4 if bad else 0


def dynamic(hw_name: str, save: Callable[[Any], None]) -> dict[str, Any]:
    """Each DYNAMIC op built once with its kernels chosen by the model and once timed on the GPU
    (``evaluate=True``), run and checked at every size; per size the set's kernel time against the exact build's
    top-1."""
    from roller.compiler.check import check_against

    out: dict[str, Any] = {}
    for name, (doc, sizes) in DYNAMIC.items():
        rec: dict[str, Any] = {}
        for how, evaluate in (("model", False), ("measured", True)):
            t = time.perf_counter()
            try:
                k = roller.compile(doc, hw=hw_name, evaluate=evaluate)
            except Exception as err:  # noqa: BLE001 - reported per op, the others still run
                rec[how] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
                continue
            r: dict[str, Any] = {"build_s": time.perf_counter() - t, "mode": k.mode,
                                 "kernels": len(k.kernels.programs) if k.kernels is not None else None,
                                 "compiled": k.compiled, "sizes": {}}
            symbol = next(iter(doc["symbols"]))
            for v in sizes:
                expr = k.op.instantiate({symbol: v})
                rng = np.random.default_rng(v)
                x = {t.name: rng.standard_normal(t.storage_shape).astype(np.float32) for t in expr.inputs}
                row: dict[str, Any] = {}
                try:
                    check_against(f"{name} at {v}", expr, x, k(**x))
                    row["ok"] = True
                except Exception as err:  # noqa: BLE001
                    row["ok"], row["error"] = False, str(err).splitlines()[0]
                row["kernel_ms"] = k.benchmark({symbol: v}, repeat=20) * 1e3
                if how == "model":   # the exact build at this size, top-1: what the set is measured against
                    row["exact_ms"] = roller.compile(expr, hw=hw_name).benchmark(repeat=20) * 1e3
                r["sizes"][str(v)] = row
            r["compiled_after"] = k.compiled
            rec[how] = r
            print(f"{name} ({how}): {r['mode']}, {r['kernels']} kernels, build {r['build_s']:.1f} s, "
                  f"ok at {sum(s['ok'] for s in r['sizes'].values())}/{len(sizes)} sizes, "
                  f"compiled {r['compiled']} -> {r['compiled_after']}", file=sys.stderr, flush=True)
        out[name] = rec
        save(out)
    return out


def models(skel: Path, hw_name: str, repeat: int, save: Callable[[Any], None]) -> list[dict[str, Any]]:
    """Each skeleton's model compiled for ``hw_name`` (CUDA), checked against onnxruntime on the same weights,
    and timed (the executor's steps on the device, inputs already there, median of ``repeat``)."""
    rows = []
    for name in MODELS:
        row: dict[str, Any] = {"model": name}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                path = restored(skel / f"{name}.onnx", Path(tmp))
                t = time.perf_counter()
                m = roller.compile_model(path, hw=hw_name, progress=False)
                _ = m.executor
                row["compile_s"] = time.perf_counter() - t
                feeds = m.random_inputs()
                check = m.check(feeds)
            row["max_abs_error"] = max(check["max_abs_error"].values())
            row["checked_against"] = check.get("reference", "")
            row.update({k: v for k, v in m.summary().items() if k.startswith("kernels") or k == "peak_bytes"})
            m.executor.run(feeds)
            row["roller_ms"] = statistics.median(m.executor.time(feeds, repeat=repeat, warmup=2)) * 1e3
            row.update(step_times(m, repeat))
            row.update(torch_baseline(name, repeat))
        except Exception as err:  # noqa: BLE001 - reported per model, the others still run
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        print(f"{name}: {row}", file=sys.stderr, flush=True)
        rows.append(row)
        save(rows)
    return rows


def step_times(m: Any, repeat: int) -> dict[str, Any]:
    """Where a run's time goes: each kernel launch of the plan timed alone (CUDA events, median of ``repeat``)
    on the executor's buffers, summed, and the copies counted."""
    from roller.backends.cuda.launcher import time_events
    from roller.graph.memory import KernelStep

    ex = m.executor
    kernels = []
    for step in m.plan.steps:
        if isinstance(step, KernelStep):
            launch = functools.partial(ex.runners[step.kernel].launch, [ex.buffers[b] for b in step.args])
            kernels.append((step.kernel, time_events(launch, repeat) * 1e3))
    top = sorted(kernels, key=lambda kv: -kv[1])[:5]
    return {"kernel_sum_ms": sum(t for _, t in kernels), "copies": len(m.plan.steps) - len(kernels),
            "slowest_kernels_ms": [[k, t] for k, t in top]}


def torch_baseline(name: str, repeat: int) -> dict[str, Any]:
    """The same architecture in PyTorch (bench/zoo's definition, its own random weights) on the GPU, eager,
    float32 without TF32: cuDNN and cuBLAS through the framework, the time a user would otherwise get."""
    try:
        return _torch_eager(name, repeat)
    except Exception as err:  # noqa: BLE001 - no baseline is a row without one, not a failed check
        return {"torch_error": f"{type(err).__name__}: {err}"}


def _torch_eager(name: str, repeat: int) -> dict[str, Any]:
    import torch

    from bench.zoo import SPECS

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    spec = SPECS[name]
    model = spec.build().eval().cuda()
    feeds = [torch.as_tensor(v).cuda() for v in spec.example_inputs().values()]
    times = []
    with torch.no_grad():
        for i in range(repeat + 5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*feeds)
            end.record()
            end.synchronize()
            if i >= 5:
                times.append(start.elapsed_time(end))
    return {"torch_eager_ms": statistics.median(times), "torch": torch.__version__}


def ranking(results: Path, hw_name: str) -> dict[str, Any]:
    """No GPU: how the current model ranks the paper suite's measured top-10 (a bench/gpu.py --json report, or
    gpu-h200-*.json with its later runs taking precedence): per op, the measured time of the candidate the
    model now puts first over the fastest measured, and Spearman's rank correlation. The programs are the
    current construction's top-10, which must still be the ones measured (an op whose best measured program is
    no longer among them is skipped); matrix programs cannot be re-predicted and are left out."""
    from roller.compiler.tune import spearman
    from roller.construction import repredict
    from roller.errors import InputError

    gpu = _bench_gpu()
    try:
        doc = json.loads(results.read_text())
        runs = [doc] if "rows" in doc else [doc[k] for k in ("paper_suite", "paper_suite_after_shrink",
                                                              "paper_suite_after_vector_staging") if k in doc]
        rows = {r["name"]: r for run in runs for r in run["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"not a bench/gpu.py --json report ({err})", source=str(results),
                         field="--results") from None
    hw, be = roller.hw.load(hw_name), roller.backends.get("cuda")
    per_op: dict[str, Any] = {}
    for op, _ in gpu.select_ops("roller119", ",".join(rows), True, 8.0, 20.0):
        row = rows[op["name"]]
        _, progs = gpu.candidates(op, hw, be, 10)
        if any(p.use_matrix for p in progs) or len(progs) != len(row["candidates"]) \
                or row["line"] not in [p.line() for p in progs]:
            continue
        pairs = [(repredict(p, hw).prediction.time_s, t) for p, t in zip(progs, row["candidates"]) if t]
        if len(pairs) < 2:
            continue
        first = min(pairs, key=lambda pt: pt[0])[1]
        per_op[op["name"]] = {"kind": row["kind"], "top1_over_best": first / min(t for _, t in pairs),
                              "spearman": spearman([p for p, _ in pairs], [t for _, t in pairs])}
    q = [r["top1_over_best"] for r in per_op.values()]
    rho = [r["spearman"] if r["spearman"] is not None else 0.0 for r in per_op.values()]
    return {"ops": len(q), "top1_within_10pct_share": sum(x <= 1.10 for x in q) / len(q),
            "median_top1_over_best": statistics.median(q), "median_spearman": statistics.median(rho),
            "per_op": per_op}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu_checks.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("skeletons", "precompile", "sample", "dynamic", "models", "ranking"))
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--backend", default="cuda", help="sample: the backend (the others take the description's)")
    ap.add_argument("--suite", default=None, help="sample: every op of this bench/gpu.py suite (default: SAMPLE)")
    ap.add_argument("--out", type=Path, help="skeletons: the folder to write")
    ap.add_argument("--skeletons", type=Path, help="precompile, models: the skeletons' folder")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", type=Path, help="dynamic, models: write the records here")
    ap.add_argument("--results", type=Path, help="ranking: a bench/gpu.py --json report (or gpu-h200-*.json)")
    args = ap.parse_args(argv)
    if args.what == "skeletons":
        if args.out is None:
            ap.error("skeletons needs --out")
        skeletons(args.out)
        return 0
    if args.what in ("precompile", "models") and args.skeletons is None:
        ap.error(f"{args.what} needs --skeletons")
    if args.what == "precompile":
        precompile(args.skeletons, args.hw, args.jobs)
        return 0
    if args.what == "sample":
        return sample(args.hw, args.backend, args.suite)
    if args.what == "ranking":
        if args.results is None:
            ap.error("ranking needs --results")
        summary = ranking(args.results, args.hw)
        print(json.dumps({k: v for k, v in summary.items() if k != "per_op"}, indent=1))
        if args.json:
            write_atomic(args.json, json.dumps(summary, indent=1).encode())
        return 0
    from roller.backends import get

    gpu = get(args.backend).device().name

    def save(records: Any) -> None:   # after every op or model: a run stopped at its limit keeps what it did
        if args.json:
            write_atomic(args.json, json.dumps({"device": gpu, "hw": args.hw, "records": records}, indent=1,
                                               default=str).encode())

    if args.what == "dynamic":
        dynamic(args.hw, save)
    else:
        models(args.skeletons, args.hw, args.repeat, save)
    return 0


if __name__ == "__main__":
    from roller.errors import RollerError

    try:
        raise SystemExit(main())
    except RollerError as err:   # a bad description, results file or model: one line and its exit code
        print(f"bench/gpu_checks.py: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
