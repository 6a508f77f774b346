"""The ONNX package's light model zoo (opset 9, as the model zoo shipped it) against onnxruntime (issue 40).

    python bench/light_zoo.py [--models squeezenet ...] [--rounds 5] [--json bench/results/light-zoo-DATE.json]

Each of the nine models (``tests/support/light_zoo.py``) gets random weights in place of its ConstantOfShape
constants (with them every class scores the same), is built by Roller from the file as shipped otherwise
(opset 9, upgraded at import), checked against onnxruntime on random inputs, then both run alternating:
``--rounds`` rounds of 5 runs each, medians (Roller's executor: inputs uploaded, outputs downloaded;
onnxruntime: 2 intra-op threads, all graph optimisations).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(name: str, rounds: int) -> dict[str, Any]:
    import numpy as np
    import onnx

    import roller
    from bench.models import ort_session
    from roller.frontends.onnx.rewrite import OpsetUpgrade
    from tests.support import light_zoo

    model = light_zoo.with_random_weights(onnx.load(light_zoo.path(name)))
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpsetUpgrade)
        m = roller.compile_model(model, hw="pocl-cpu", progress=False)
    compile_s = time.perf_counter() - t
    feeds = m.random_inputs(0)
    check = m.check(feeds)
    path = Path(f"/tmp/roller-light-{name}.onnx")
    onnx.save(model, path)
    sess = ort_session(path)
    path.unlink()
    feeds_ort = {k: np.asarray(v) for k, v in feeds.items()}
    m.run(feeds)
    sess.run(None, feeds_ort)
    ours: list[float] = []
    theirs: list[float] = []
    jobs = [(ours, lambda: m.run(feeds)), (theirs, lambda: sess.run(None, feeds_ort))]
    for r in range(rounds):
        for out, fn in (jobs if r % 2 == 0 else jobs[::-1]):
            once = []
            for _ in range(5):
                t = time.perf_counter()
                fn()
                once.append(time.perf_counter() - t)
            out.append(statistics.median(once))
    return {"model": name, "opset": opset, "kernels": len(m.by_key), "launches": len(m.kernels),
            "compile_s": round(compile_s, 1), "max_abs_error": f"{max(check['max_abs_error'].values()):.2g}",
            "check": "ok" if check["ok"] else "MISMATCH", "roller_ms": round(statistics.median(ours) * 1e3, 2),
            "onnxruntime_ms": round(statistics.median(theirs) * 1e3, 2),
            "ratio": round(statistics.median(ours) / statistics.median(theirs), 2)}


def main(argv: list[str] | None = None) -> int:
    from bench.models import cpu_name
    from tests.support import light_zoo

    ap = argparse.ArgumentParser(prog="python bench/light_zoo.py", description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(light_zoo.NAMES), choices=light_zoo.NAMES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(measure(name, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()} ({os.cpu_count()} cores)",
               "description": "pocl-cpu", "command": "python bench/light_zoo.py --json FILE",
               "target": "pocl-cpu (PoCL on this CPU) against onnxruntime in the same process, alternating",
               "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
