"""ONNX's own backend node tests (``onnx.backend.test``) against Roller, through ``roller.compiler.onnx_backend``.

The cases are those of the installed onnx package (``load_model_tests(kind="node")``: with onnx 1.23 they are
generated in memory from ``onnx/backend/test/case/node``, expected outputs included). A case is selected when
every node of its graph has an op type Roller translates (``supported_ops()``). Each is prepared on
``device="CPU"`` (the pocl-cpu description, the OpenCL backend, run here on PoCL), run on each of its data
sets, and compared with the case's expected outputs at the case's own rtol/atol (``Runner.assert_similar_outputs``:
shapes, element types and values).

A selected case that cannot pass for a reason outside the ONNX importer is listed in ``EXCLUDED`` with the reason
(docs/onnx.md shows the list). An excluded case still runs: Roller must refuse it with one of its errors (never a
traceback, never a different result), so a case that starts passing fails here until it leaves the list. A
case whose every input is folded into the model (``roller.compiler.onnx_backend`` specialises inputs used as
constants, empty ones and those of integer types no kernel holds) computes nothing on the device: it is
excluded as ``FOLDED``, and must indeed fold.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

import roller.compiler.onnx_backend as backend
from roller.backends import get
from roller.errors import RollerError
from roller.frontends.onnx import supported_ops

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx.md"

# -- why a selected case is excluded: one reason per missing piece ---------------------------------------------

INT = ("integer or bool results of ops that keep them on the host: MaxPool's indices, Dropout's mask, Pad's edge, "
       "reflect and wrap modes of integer tensors")
WIDE_INT = ("int16, uint16, uint32 and uint64 tensors: no kernel holds them (an input of those types is folded into "
            "the model; a result of those types is refused)")
STRING = "string tensors"
NARROW = ("8-, 4- and 2-bit element types (float8 variants, float4, int4, uint4, int2, uint2) on the device "
          "(IR: element types)")
BLOCKED = "blocked quantization (block_size: one scale per block of an axis): per tensor and per axis are translated"
TRAINING = "training mode: Dropout draws a random mask, BatchNormalization returns updated running statistics"
SEQUENCE = "sequence and optional values: only tensors are imported"
HALF_ROUNDING = ("float16 attention whose kernels round to float16 at other points than the reference (one "
                 "element differs by one float16 step beyond rtol 1e-3; which case it is moves with the fusion)")
#: reasons of cases that run and are known to differ from the expected outputs (the others are refused)
DIFFERS = (HALF_ROUNDING,)
FOLDED = ("every input is folded into the model (inputs used as constants, empty inputs, inputs of int16, uint16, "
          "uint32 or uint64): onnx.reference evaluates the case at import and nothing runs on the device")

#: test-name pattern (a regular expression matched in full; the first match counts) -> why the case is excluded
EXCLUDED: dict[str, str] = {
    # element types
    r"test_cast(like)?_.*(FLOAT8|FLOAT4|INT4|INT2).*": NARROW,
    r"test_(de)?quantizelinear_(e4m3fn|e5m2|float4e2m1|u?int4|u?int2)(_.*)?": NARROW,
    r"test_(de)?quantizelinear_u?int16": WIDE_INT,
    r"test_(de)?quantizelinear_blocked(_.*)?": BLOCKED,
    r"test_attention_4d_causal_fp16(_expanded)?": HALF_ROUNDING,
    r"test_(edge|reflect|wrap)_pad": INT,
    r"test_maxpool_with_argmax_.*": INT,
    r"test_reduce_(max|min)_bool_inputs": INT,
    r"test_(training_)?dropout_.*mask.*": INT,
    r"test_mod_(mixed_sign_int16|uint16|uint32|uint64)": WIDE_INT,
    r"test_(add|sub|mul|div|max|min)_(int16|uint16|uint32|uint64)": WIDE_INT,
    r"test_top_k_uint64": WIDE_INT,
    r"test_constantofshape_int_.*": FOLDED,
    r"test_range_int32_type_negative_delta": FOLDED,
    # the window functions' expanded graphs compute from the size alone (Range, Cos): constants throughout
    r"test_(blackman|hamming|hann)window(_symmetric)?_expanded": FOLDED,
    r"test_(equal|greater|less|greater_equal|less_equal)_u?int(16|32|64)(_expanded)?": FOLDED,
    r"test_equal_string(_broadcast)?": STRING,
    # sizes
    r"test_reduce_.*_empty_set.*": FOLDED,
    r"test_split_zero_size_splits_opset\d+": FOLDED,
    r"test_reshape_allowzero_reordered": FOLDED,
    r"test_tri[lu]_zero": FOLDED,
    # not inference
    r"test_batchnorm_.*_training_mode": TRAINING,
    r"test_training_dropout(_default)?": TRAINING,
    r"test_identity_(opt|sequence)": SEQUENCE,
    r"test_constantofshape_float_ones": FOLDED,
    r"test_range_float_type_positive_delta": FOLDED,
    r"test_range_float16_type_positive_delta": FOLDED,
    r"test_range_bfloat16_type_positive_delta": FOLDED,
}

# -- the cases -----------------------------------------------------------------------------------------------

with warnings.catch_warnings():   # generating the cases' data overflows casts on purpose
    warnings.simplefilter("ignore")
    CASES = {c.name: c for c in load_model_tests(kind="node")}
SUPPORTED = frozenset(supported_ops())
SELECTED = sorted(n for n, c in CASES.items() if {node.op_type for node in c.model.graph.node} <= SUPPORTED)


#: Attention cases in the quick tier (the others are slow: each builds eight or more kernels)
ATTENTION_QUICK = frozenset({
    "test_attention_4d", "test_attention_3d", "test_attention_4d_gqa", "test_attention_3d_gqa",
    "test_attention_4d_scaled", "test_attention_4d_causal", "test_attention_4d_attn_mask",
    "test_attention_4d_attn_mask_bool", "test_attention_4d_with_past_and_present", "test_attention_4d_softcap",
    "test_attention_4d_with_qk_matmul_softmax", "test_attention_4d_causal_nonpad_batch_prefill",
    "test_attention_local_window", "test_attention_23_boolmask_fullymasked_row_nan_robustness"})


#: expanded cases in the quick tier: they hold the op types whose own cases are all excluded (Cast, CastLike,
#: ConstantOfShape, Range, Shape, Size: shape arithmetic, folded at import)
EXPANDED_QUICK = frozenset({"test_rms_normalization_4d_axis1_expanded", "test_gelu_tanh_1_expanded",
                            "test_layer_normalization_4d_axis1_expanded"})


def slow(name: str) -> bool:
    """Cases in the slow tier: the expanded forms (ONNX function bodies, built from op types the single-node
    cases cover) and most Attention cases. The quick tier runs every op type that any case runs."""
    if "_expanded" in name:
        return name not in EXPANDED_QUICK
    return name.startswith("test_attention") and name not in ATTENTION_QUICK


def exclusion(name: str) -> str | None:
    """Why ``name`` is excluded, or None."""
    for pattern, reason in EXCLUDED.items():
        if re.fullmatch(pattern, name):
            return reason
    return None


def _array(t: Any) -> np.ndarray:
    return numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else np.asarray(t)


def run_case(name: str) -> tuple[Any, list[tuple[Sequence[np.ndarray], Sequence[np.ndarray]]]]:
    """(the prepared model, [(outputs, expected outputs)] per data set) of a case, run on the CPU device."""
    case = CASES[name]
    rep = backend.prepare(case.model, "CPU")
    results = []
    for inputs, expected in case.data_sets:
        got = list(rep.run([_array(i) for i in inputs]))
        results.append((got, [_array(e) for e in expected]))
    return rep, results


def folded(name: str, rep: Any) -> bool:
    """Whether every input of the case was folded into the model (so the device computed nothing from them)."""
    return bool(CASES[name].model.graph.input) and not rep.model.graph.inputs


@needs_device
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if slow(n) else n for n in SELECTED])
def test_node(name: str) -> None:
    reason = exclusion(name)
    case = CASES[name]
    if reason in DIFFERS:
        # known to run and to differ from the case's expected outputs: still checked, so a fix shows up
        _, results = run_case(name)
        with pytest.raises(AssertionError):
            for got, expected in results:
                Runner.assert_similar_outputs(expected, got, rtol=case.rtol, atol=case.atol)
        return
    try:
        rep, results = run_case(name)
    except RollerError:
        if reason is None or reason == FOLDED:
            raise
        return   # refused, as an excluded case must be
    assert reason is None or reason == FOLDED, \
        f"{name} is excluded ({reason}) but runs now: check it and take it off EXCLUDED"
    assert folded(name, rep) == (reason == FOLDED), \
        f"{name} {'folds' if folded(name, rep) else 'does not fold'} at import: list it as FOLDED or not"
    for got, expected in results:
        Runner.assert_similar_outputs(expected, got, rtol=case.rtol, atol=case.atol)


def report() -> str:
    """The exclusions as docs/onnx.md lists them (``python tests/frontends/test_onnx_conformance.py``): counts, then the
    excluded cases grouped by reason."""
    excluded: dict[str, list[str]] = {}
    for name in SELECTED:
        reason = exclusion(name)
        if reason is not None:
            excluded.setdefault(reason, []).append(name)
    run = len(SELECTED) - sum(len(v) for v in excluded.values())
    head = (f"{len(CASES)} node test cases in onnx {onnx.__version__}; {len(SELECTED)} selected (every node of a "
            f"supported op type); {run} run and compared; {len(SELECTED) - run} excluded; "
            f"{sum(slow(n) for n in SELECTED if exclusion(n) is None)} of those run are in the slow tier.")
    lines = [head, ""]
    for reason, names in sorted(excluded.items(), key=lambda kv: -len(kv[1])):
        lines += [f"**{len(names)}: {reason}.**", "", ", ".join(f"`{n}`" for n in names), ""]
    return "\n".join(lines)


def test_docs_show_this_list_and_every_supported_op_type() -> None:
    text = DOC.read_text()
    assert report().rstrip() in text, "docs/onnx.md is stale: paste `python tests/frontends/test_onnx_conformance.py` in"
    table = text.split("## Supported op types", 1)[1].split("\n## ", 1)[0]
    listed = {w for row in table.splitlines() if row.startswith("| ") for w in re.findall(r"[A-Z][A-Za-z0-9]+",
                                                                                         row.split("|")[1])}
    assert SUPPORTED <= listed, f"docs/onnx.md does not list {sorted(SUPPORTED - listed)}"
    assert f"{len(SUPPORTED)} op types of the default domain" in text


if __name__ == "__main__":
    print(report())
