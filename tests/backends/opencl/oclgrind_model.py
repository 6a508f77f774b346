"""Run one of the tests' models under whatever OpenCL device ROLLER_CL_DEVICE names (the tests name Oclgrind),
its buffers poisoned (ROLLER_POISON=1), and print one JSON line: whether it matched onnxruntime. Oclgrind
itself reports on stderr any access outside a buffer or data race."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import roller  # noqa: E402
from tests.support import language_graphs  # noqa: E402
from tests.support.zoo_graphs import ALL  # noqa: E402

MODELS = {"gpt2": lambda: language_graphs.gpt2(), "bert": lambda: language_graphs.bert(layers=1),
          "llama": lambda: language_graphs.llama(), **{n: (lambda f=f: f()[0]) for n, f in ALL.items()}}

if __name__ == "__main__":
    m = roller.compile_model(MODELS[sys.argv[1]](), hw="pocl-cpu", cache=False, jobs=1)
    print(json.dumps({"ok": bool(m.check(m.random_inputs(1))["ok"]), "kernels": len(m.kernels)}))
