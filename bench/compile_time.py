"""Time from an ONNX file to a model's first result, split by stage, cold and warm (issue 39).

    python bench/compile_time.py --zoo DIR [--models resnet18 ...] [--eval] [--json FILE]

Each model is built in a child process twice: cold (an empty Roller kernel cache and an empty PoCL cache) and
warm (the same caches again, full). A child reports the stages ``compile_model`` records (``Stages.seconds``:
import, fuse, block, pad, pack, build: construction and rendering, kernels in parallel; compile: the device compiler,
all kernels at once; plan), the whole ``compile_model`` call, the first run (uploads, the launches, and whatever device compile is still
left) and a second run. onnxruntime's session creation for the same file is timed in this process (2 intra-op
threads, all graph optimisations, median of 3). The models come from ``python -m bench.zoo --out DIR`` (and
``python -m bench.zoo.transformers_models --out DIR`` for ``bert``); those that are missing are skipped.

``--eval`` builds with ``evaluate=True`` (candidates timed on this machine, early stopping, the layouts
timed too).

``--iree BIN`` (a folder holding ``iree-import-onnx`` and ``iree-compile``: ``pip install
'iree-base-compiler[onnx]'``) also times a peer compiler on the same file in the same run: IREE's ONNX import,
then its compile for this CPU (``llvm-cpu``, ``--iree-llvmcpu-target-cpu=host``), from empty folders.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "densenet121", "bert_base_layer", "bert")
STAGES = ("import", "fuse", "block", "pad", "pack", "build", "compile", "plan")

CHILD = """
import json, sys, time
t = time.perf_counter()
import roller
m = roller.compile_model(sys.argv[1], hw=sys.argv[2], evaluate=sys.argv[3] == "eval")
compiled = time.perf_counter() - t
feeds = m.random_inputs(0)
t = time.perf_counter(); m.run(feeds); first = time.perf_counter() - t
t = time.perf_counter(); m.run(feeds); second = time.perf_counter() - t
print(json.dumps({"stages": m.stages.seconds, "compile_s": compiled, "first_run_s": first, "second_run_s": second,
                  "kernels": len(m.by_key), "launches": len(m.kernels), "cache_hits": m.cache_hits}))
"""


def child(path: Path, hw: str, caches: Path, evaluate: bool) -> dict[str, Any]:
    env = dict(os.environ, ROLLER_CACHE_DIR=str(caches / "roller"), POCL_CACHE_DIR=str(caches / "pocl"))
    env.pop("ROLLER_NO_CACHE", None)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), hw, "eval" if evaluate else "model"], env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"{path.name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


def ort_session_s(path: Path) -> float:
    import onnxruntime as ort

    times = []
    for _ in range(3):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        t = time.perf_counter()
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(path: Path, hw: str, evaluate: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="roller-compile-time-") as tmp:
        caches = Path(tmp)
        (caches / "roller").mkdir(mode=0o700)
        (caches / "pocl").mkdir()
        cold = child(path, hw, caches, evaluate)
        warm = child(path, hw, caches, evaluate)
    return {"model": path.stem, "hw": hw, "evaluate": evaluate, "cold": cold, "warm": warm, "ort_session_s": ort_session_s(path)}


def iree_s(path: Path, bin_dir: Path) -> dict[str, float | str]:
    """Seconds of IREE's import of ``path`` and of its compile for this CPU, or the reason it failed."""
    with tempfile.TemporaryDirectory(prefix="roller-iree-") as tmp:
        mlir, vmfb = Path(tmp) / "model.mlir", Path(tmp) / "model.vmfb"
        steps = {"import_s": [str(bin_dir / "iree-import-onnx"), str(path), "-o", str(mlir)],
                 "compile_s": [str(bin_dir / "iree-compile"), "--iree-hal-target-device=local",
                               "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host",
                               str(mlir), "-o", str(vmfb)]}
        out: dict[str, float | str] = {}
        for key, cmd in steps.items():
            t = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["failed"])[-1]
                out["error"] = f"{key[:-2]}: {tail[:200]}"
                return out
            out[key] = time.perf_counter() - t
        return out


def row(m: dict[str, Any]) -> dict[str, Any]:
    cold, warm = m["cold"], m["warm"]
    stages = " / ".join(f"{cold['stages'].get(s, 0.0):.1f}" for s in STAGES)
    return {"model": m["model"], "kernels / launches": f"{cold['kernels']} / {cold['launches']}",
            "cold: to first result s": f"{cold['compile_s'] + cold['first_run_s']:.1f}",
            "cold: " + " / ".join(STAGES) + " s": stages,
            "cold: first run s": f"{cold['first_run_s']:.1f}",
            "warm: to first result s": f"{warm['compile_s'] + warm['first_run_s']:.1f}",
            "warm: fuse / build s": f"{warm['stages'].get('fuse', 0.0):.1f} / {warm['stages'].get('build', 0.0):.1f}",
            "onnxruntime session s": f"{m['ort_session_s']:.2f}",
            **({"IREE import + compile s": (f"{m['iree']['import_s']:.1f} + {m['iree']['compile_s']:.1f}"
                                             if "error" not in m["iree"] else m["iree"]["error"])}
               if "iree" in m else {})}


def main(argv: list[str] | None = None) -> int:
    from bench.models import cpu_name

    ap = argparse.ArgumentParser(prog="python bench/compile_time.py", description=__doc__.split("\n")[0])
    ap.add_argument("--zoo", type=Path, required=True, help="folder of the exported .onnx files")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--json", type=Path, default=None, help="write the results here (bench/results/compile-time-*)")
    ap.add_argument("--iree", type=Path, default=None, metavar="BIN",
                    help="folder with iree-import-onnx and iree-compile: time IREE on each model too")
    ap.add_argument("--eval", dest="evaluate", action="store_true",
                    help="build with evaluate=True (each kernel's candidates timed here)")
    args = ap.parse_args(argv)
    measured = []
    for name in args.models:
        path = args.zoo / f"{name}.onnx"
        if not path.exists():
            print(f"{name}: no {path}, skipped", file=sys.stderr)
            continue
        m = measure(path, args.hw, args.evaluate)
        if args.iree is not None:
            m["iree"] = iree_s(path, args.iree)
        measured.append(m)
        print(json.dumps(row(m)), flush=True)
    if args.json:
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()} ({os.cpu_count()} cores)",
               "description": args.hw + (", evaluate=True" if args.evaluate else ""),
               "command": "python bench/compile_time.py --zoo DIR --json FILE" + (" --eval" if args.evaluate else ""),
               "evaluate": args.evaluate,
               "target": f"{args.hw} (PoCL on this CPU); onnxruntime's session creation in the same process"
                         + ("; IREE's import and llvm-cpu compile of the same file" if args.iree else ""),
               "rows": [row(m) for m in measured], "measurements": measured}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
