"""Compiled models called from several threads at once give each call its own answer: runs of one model take
turns on its device buffers (without that, 4 threads x 300 runs returned another call's output 973 times in
1,200), a model with an open length is built and run at several lengths from threads, two models run side by
side, and a generator's cache serves one generation at a time."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get

CL = get("opencl")
pytestmark = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
THREADS, RUNS = 4, 40


def mlp(width: int, seq: str | int = 6) -> onnx.ModelProto:
    rng = np.random.default_rng(width)
    w1 = rng.standard_normal((width, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "w2"], ["y"])], f"mlp{width}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, 8])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def expected(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w1, w2 = (numpy_helper.to_array(t) for t in m.graph.initializer)
    return np.maximum(x @ w1, 0) @ w2


def hammer(call: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> int:
    """Runs ``call(i)`` for THREADS x RUNS values of ``i`` from THREADS threads released together; how many
    results differed from what they should be."""
    start = threading.Barrier(THREADS)

    def worker(t: int) -> int:
        start.wait()
        wrong = 0
        for r in range(RUNS):
            got, want = call(t * RUNS + r)
            wrong += not np.allclose(got, want, rtol=1e-4, atol=1e-4)
        return wrong

    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(worker, range(THREADS)))


def test_one_model_from_several_threads() -> None:
    m = mlp(16)
    cm = roller.compile_model(m, hw="pocl-cpu")
    inputs = [np.random.default_rng(i).standard_normal((6, 16)).astype(np.float32) for i in range(THREADS * RUNS)]
    assert hammer(lambda i: (cm.run({"x": inputs[i]})["y"], expected(m, inputs[i]))) == 0


def test_two_models_side_by_side() -> None:
    a, b = mlp(16), mlp(24)
    ca, cb = roller.compile_model(a, hw="pocl-cpu"), roller.compile_model(b, hw="pocl-cpu")

    def call(i: int) -> tuple[np.ndarray, np.ndarray]:
        m, cm, width = (a, ca, 16) if i % 2 else (b, cb, 24)
        x = np.random.default_rng(i).standard_normal((6, width)).astype(np.float32)
        return cm.run({"x": x})["y"], expected(m, x)

    assert hammer(call) == 0


def test_an_open_length_from_several_threads() -> None:
    """One build over every length (the lengths' first runs race to set their launchers up)."""
    m = mlp(16, "s")
    cm = roller.compile_model(m, hw="pocl-cpu", ranges={"s": (1, 32)})
    assert cm.mode == "generic"

    def call(i: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.random.default_rng(i).standard_normal((1 + i % 7, 16)).astype(np.float32)
        return cm.run({"x": x})["y"], expected(m, x)

    assert hammer(call) == 0


def test_generations_from_several_threads() -> None:
    """One generator (one cache) asked for four prompts at once gives each the tokens it gives alone."""
    from roller.compiler.generation import Generator
    from tests.support.language_graphs import gpt2

    gen = Generator(gpt2(seq=1, past=11, layers=1, position_input=True), "pocl-cpu", context=12)
    prompts = [[5, 7, 9], [1], [3, 4, 5, 6], [2, 2]]
    alone = [gen.generate(p, 12 - len(p)).tokens for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: gen.generate(p, 12 - len(p)).tokens, prompts * 3))
    assert together == alone * 3
