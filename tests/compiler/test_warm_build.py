"""A warm build (issue 39): the fusion solver's answer comes from the cache, so a second process solves nothing
and never imports scipy.optimize (0.35-0.43 s of a 2 s warm build); a damaged stored answer is solved again."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roller.backends import get

MINI = Path(__file__).resolve().parents[2] / "examples" / "models" / "mini_resnet.onnx"
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())

BUILD = """
import json, sys
import roller
m = roller.compile_model(sys.argv[1], "pocl-cpu", progress=False)
out = next(iter(m.run(m.random_inputs(0)).values()))
print(json.dumps({"solver": "scipy.optimize" in sys.modules, "kernels": len(m.by_key), "sum": float(out.sum())}))
"""


def _build(cache: Path) -> dict:
    env = dict(os.environ, ROLLER_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", BUILD, str(MINI)], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_cl
def test_a_warm_build_solves_no_fusion(private_cache: Path) -> None:
    cold = _build(private_cache)
    assert cold["solver"]
    covers = list((private_cache / "results" / "fusion-cover").rglob("*.json"))
    assert covers
    warm = _build(private_cache)
    assert not warm["solver"] and warm["kernels"] == cold["kernels"] and warm["sum"] == cold["sum"]
    for path in covers:   # a stored answer (checksum intact) that does not cover the operators is not used
        doc = json.loads(path.read_text())
        body = [0]
        path.write_text(json.dumps({**doc, "body": body,
                                    "sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}))
    again = _build(private_cache)
    assert again["solver"] and again["kernels"] == cold["kernels"] and again["sum"] == cold["sum"]
