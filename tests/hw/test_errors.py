"""Malformed hardware descriptions: each gives its exact one-line message and exit code 2 through the CLI."""
from __future__ import annotations

import re

import pytest

from roller.cli.main import main
from roller.hw import list_bundled

# A valid description; the line numbers in the expected messages refer to this text (line 1 = "name:").
BASE = """\
name: testdev
vendor: acme
backend: cuda
target: sm_70
notes: a test device
memory:
  - name: global
    scope: device
    capacity_bytes: 16GiB
    bandwidth_gbps: {peak: 900, effective: 750}
    transaction_bytes: 32
    line_bytes: 128
  - name: shared
    scope: block
    capacity_per_unit_bytes: 96KiB
    capacity_per_block_bytes: 48KiB
    bandwidth_gbps: {peak: 15000, effective: 12000}
    transaction_bytes: 4
    line_bytes: 128
    banks: 32
    bank_width_bytes: 4
  - name: register
    scope: thread
    capacity_per_unit_bytes: 256KiB
    capacity_per_thread_bytes: 1020
    bandwidth_gbps: {peak: 90000, effective: 90000}
    transaction_bytes: 4
    line_bytes: 4
parallelism:
  compute_units: 80
  sub_partitions: 4
  warp_size: 32
  max_threads_per_block: 1024
  max_threads_per_unit: 2048
  max_blocks_per_unit: 32
  registers_per_unit: 65536
  max_registers_per_thread: 255
  register_tile_budget: 96
compute:
  float32: {vector: {peak_tflops: 15.7, effective_tflops: 12.48}}
  float16:
    vector: {peak_tflops: 31.4, effective_tflops: 31.4}
    matrix: {peak_tflops: 125, effective_tflops: 100}
matrix_instructions:
  - {name: wmma_m16n16k16_f16, shape: [16, 16, 16], input_dtype: float16, accumulator_dtype: float32}
"""

SHARED_LAYER = BASE[BASE.index("  - name: shared"):BASE.index("  - name: register")]
REGISTER_LAYER = BASE[BASE.index("  - name: register"):BASE.index("parallelism:")]
DTYPE_LIST = "float64, float32, float16, bfloat16, int64, int32, int8, uint8, bool"


def sub(old: str, new: str):
    def edit(text: str) -> str:
        assert text.count(old) == 1, f"{old!r} must occur once in BASE"
        return text.replace(old, new)
    return edit


def whole(text: str):
    return lambda _: text


# (id, edit of BASE, expected message after "roller: error: "; {p} = the file's path)
CASES = [
    ("banks-zero", sub("banks: 32", "banks: 0"),
     "{p}:20 memory[1].banks: expected a positive integer, got 0"),
    ("banks-negative", sub("banks: 32", "banks: -4"),
     "{p}:20 memory[1].banks: expected a positive integer, got -4"),
    ("banks-string", sub("banks: 32", 'banks: "32"'),
     "{p}:20 memory[1].banks: expected a positive integer, got '32'"),
    ("banks-float", sub("banks: 32", "banks: 1.5"),
     "{p}:20 memory[1].banks: expected a positive integer, got 1.5"),
    ("banks-bool", sub("banks: 32", "banks: true"),
     "{p}:20 memory[1].banks: expected a positive integer, got true"),
    ("banks-null-on-block", sub("banks: 32", "banks: null"),
     "{p}:20 memory[1].banks: expected a positive integer, got null"),
    ("banks-missing", sub("    banks: 32\n", ""),
     "{p}:13 memory[1]: missing key 'banks'"),
    ("banks-typo", sub("banks: 32", "bankz: 32"),
     "{p}:20 memory[1].bankz: unknown key; did you mean 'banks'?"),
    ("bank-width-not-pow2", sub("bank_width_bytes: 4", "bank_width_bytes: 3"),
     "{p}:21 memory[1].bank_width_bytes: expected a power of two, got 3"),
    ("warp-size-typo", sub("  warp_size: 32", "  warp_sise: 32"),
     "{p}:32 parallelism.warp_sise: unknown key; did you mean 'warp_size'?"),
    ("name-missing", sub("name: testdev\n", ""),
     "{p}:1: missing key 'name'"),
    ("name-bad", sub("name: testdev", 'name: "a b"'),
     "{p}:1 name: expected a name of letters, digits, '-', '_' or '.', got 'a b'"),
    ("vendor-empty", sub("vendor: acme", 'vendor: ""'),
     "{p}:2 vendor: expected a non-empty string, got ''"),
    ("backend-unknown", sub("backend: cuda", "backend: metal"),
     "{p}:3 backend: expected one of cuda, hip, opencl, poplar, got 'metal'"),
    ("target-mismatch", sub("target: sm_70", "target: gfx906"),
     "{p}:4 target: expected a CUDA target like sm_70 for backend 'cuda', got 'gfx906'"),
    ("notes-not-string", sub("notes: a test device", "notes: 5"),
     "{p}:5 notes: expected a string, got 5"),
    ("top-key-typo", sub("memory:\n", "memroy:\n"),
     "{p}:6 memroy: unknown key; did you mean 'memory'?"),
    ("size-word", sub("capacity_bytes: 16GiB", "capacity_bytes: lots"),
     "{p}:9 memory[0].capacity_bytes: expected a positive size in bytes (an integer or e.g. 96KiB), got 'lots'"),
    ("size-zero", sub("capacity_bytes: 16GiB", "capacity_bytes: 0"),
     "{p}:9 memory[0].capacity_bytes: expected a positive size in bytes (an integer or e.g. 96KiB), got 0"),
    ("size-bad-unit", sub("capacity_bytes: 16GiB", "capacity_bytes: 16QiB"),
     "{p}:9 memory[0].capacity_bytes: expected a positive size in bytes (an integer or e.g. 96KiB), got '16QiB'"),
    ("bw-effective-above-peak", sub("{peak: 900, effective: 750}", "{peak: 900, effective: 950}"),
     "{p}:10 memory[0].bandwidth_gbps.effective: expected at most the peak (900), got 950"),
    ("bw-peak-zero", sub("{peak: 900, effective: 750}", "{peak: 0, effective: 750}"),
     "{p}:10 memory[0].bandwidth_gbps.peak: expected a positive number, got 0"),
    ("bw-missing-effective", sub("{peak: 900, effective: 750}", "{peak: 900}"),
     "{p}:10 memory[0].bandwidth_gbps: missing key 'effective'"),
    ("bw-scalar", sub("{peak: 900, effective: 750}", "900"),
     "{p}:10 memory[0].bandwidth_gbps: expected a mapping, got 900"),
    ("bw-unknown-key", sub("{peak: 900, effective: 750}", "{peak: 900, effectve: 750}"),
     "{p}:10 memory[0].bandwidth_gbps.effectve: unknown key; did you mean 'effective'?"),
    ("transaction-not-pow2", sub("transaction_bytes: 32", "transaction_bytes: 48"),
     "{p}:11 memory[0].transaction_bytes: expected a power of two, got 48"),
    ("line-not-multiple", sub("transaction_bytes: 32\n    line_bytes: 128", "transaction_bytes: 32\n    line_bytes: 16"),
     "{p}:12 memory[0].line_bytes: expected a multiple of transaction_bytes (32), got 16"),
    ("scope-unknown", sub("scope: block", "scope: shared"),
     "{p}:14 memory[1].scope: expected one of device, cache, block, thread, got 'shared'"),
    ("block-above-unit", sub("capacity_per_block_bytes: 48KiB", "capacity_per_block_bytes: 128KiB"),
     "{p}:16 memory[1].capacity_per_block_bytes: expected at most capacity_per_unit_bytes (96KiB), got 128KiB"),
    ("inner-not-smaller", sub("capacity_bytes: 16GiB", "capacity_bytes: 32KiB"),
     "{p}:16 memory[1].capacity_per_block_bytes: expected less than memory[0].capacity_bytes (32KiB), got 48KiB"),
    ("thread-not-smaller", sub("capacity_per_thread_bytes: 1020", "capacity_per_thread_bytes: 64KiB"),
     ("{p}:25 memory[2].capacity_per_thread_bytes: expected less than memory[1].capacity_per_block_bytes "
      "(48KiB), got 64KiB")),
    ("key-not-for-scope", sub("    scope: block\n", "    scope: block\n    capacity_bytes: 1MiB\n"),
     "{p}:15 memory[1].capacity_bytes: not used by 'block' layers; remove it"),
    ("outermost-not-device", sub("scope: device", "scope: cache"),
     "{p}:8 memory[0].scope: expected 'device' for the outermost layer, got 'cache'"),
    ("innermost-not-thread", sub(REGISTER_LAYER, ""),
     "{p}:14 memory[1].scope: expected 'thread' for the innermost layer, got 'block'"),
    ("scope-order", sub(SHARED_LAYER + REGISTER_LAYER,
                        REGISTER_LAYER.replace("capacity_per_thread_bytes: 1020", "capacity_per_thread_bytes: 1KiB")
                        + SHARED_LAYER.replace("48KiB", "512").replace("96KiB", "1KiB")
                        + REGISTER_LAYER.replace("register", "reg2").replace("1020", "256")),
     "{p}:21 memory[2].scope: expected 'thread' or a scope inside it (layers go outermost first), got 'block'"),
    ("one-layer", sub(SHARED_LAYER + REGISTER_LAYER, ""),
     "{p}:6 memory: expected at least 2 layers (outermost first), got 1"),
    ("memory-not-list", sub("memory:\n" + BASE[BASE.index("  - name: global"):BASE.index("parallelism:")],
                            "memory: 3\n"),
     "{p}:6 memory: expected a list of memory layers (outermost first), got 3"),
    ("duplicate-layer-name", sub("name: register", "name: shared"),
     "{p}:22 memory[2].name: expected a name not used by memory[1], got 'shared'"),
    ("register-file-mismatch", sub("capacity_per_unit_bytes: 256KiB", "capacity_per_unit_bytes: 128KiB"),
     "{p}:24 memory[2].capacity_per_unit_bytes: expected 4 x parallelism.registers_per_unit = 256KiB, got 128KiB"),
    ("thread-above-registers", sub("capacity_per_thread_bytes: 1020", "capacity_per_thread_bytes: 2048"),
     ("{p}:25 memory[2].capacity_per_thread_bytes: expected at most 4 x parallelism.max_registers_per_thread "
      "= 1020, got 2048")),
    ("block-not-warp-multiple", sub("max_threads_per_block: 1024", "max_threads_per_block: 1000"),
     "{p}:33 parallelism.max_threads_per_block: expected a multiple of parallelism.warp_size (32), got 1000"),
    ("unit-below-block", sub("max_threads_per_unit: 2048", "max_threads_per_unit: 512"),
     "{p}:34 parallelism.max_threads_per_unit: expected at least max_threads_per_block (1024), got 512"),
    ("max-regs-above-file", sub("max_registers_per_thread: 255", "max_registers_per_thread: 70000"),
     "{p}:37 parallelism.max_registers_per_thread: expected at most registers_per_unit (65536), got 70000"),
    ("tile-budget-too-big", sub("register_tile_budget: 96", "register_tile_budget: 300"),
     "{p}:38 parallelism.register_tile_budget: expected at most max_registers_per_thread (255), got 300"),
    ("units-missing", sub("  compute_units: 80\n", ""),
     "{p}:29 parallelism: missing key 'compute_units'"),
    ("units-zero", sub("compute_units: 80", "compute_units: 0"),
     "{p}:30 parallelism.compute_units: expected a positive integer, got 0"),
    ("poplar-needs-hw-threads", sub("backend: cuda\ntarget: sm_70", "backend: poplar\ntarget: ipu2"),
     "{p}:29 parallelism: missing key 'hardware_threads_per_unit' (required for backend 'poplar')"),
    ("dtype-unknown", sub("  float16:\n", "  fp16:\n"),
     "{p}:41 compute.fp16: unknown dtype; expected one of: " + DTYPE_LIST),
    ("dtype-typo", sub("  float16:\n", "  flaot16:\n"),
     "{p}:41 compute.flaot16: unknown dtype; did you mean 'float16'?"),
    ("float32-missing", sub("  float32: {vector: {peak_tflops: 15.7, effective_tflops: 12.48}}\n", ""),
     "{p}:39 compute: missing key 'float32'"),
    ("vector-missing", sub("    vector: {peak_tflops: 31.4, effective_tflops: 31.4}\n", ""),
     "{p}:41 compute.float16: missing key 'vector'"),
    ("tflops-above-peak", sub("effective_tflops: 12.48", "effective_tflops: 20"),
     "{p}:40 compute.float32.vector.effective_tflops: expected at most peak_tflops (15.7), got 20"),
    ("tflops-word", sub("peak_tflops: 15.7", "peak_tflops: fast"),
     "{p}:40 compute.float32.vector.peak_tflops: expected a positive number, got 'fast'"),
    ("mi-shape", sub("shape: [16, 16, 16]", "shape: [16, 16]"),
     "{p}:45 matrix_instructions[0].shape: expected [m, n, k], three positive integers, got [16, 16]"),
    ("mi-no-matrix-peak", sub("input_dtype: float16", "input_dtype: float32"),
     "{p}:45 matrix_instructions[0].input_dtype: expected a dtype with a compute.<dtype>.matrix peak, got 'float32'"),
    ("mi-bad-acc", sub("accumulator_dtype: float32", "accumulator_dtype: double"),
     "{p}:45 matrix_instructions[0].accumulator_dtype: expected one of " + DTYPE_LIST + ", got 'double'"),
    ("mi-missing-key", sub(", accumulator_dtype: float32}", "}"),
     "{p}:45 matrix_instructions[0]: missing key 'accumulator_dtype'"),
    ("duplicate-key", sub("  warp_size: 32\n", "  warp_size: 32\n  warp_size: 64\n"),
     "{p}:33 parallelism.warp_size: duplicate key"),
    ("invalid-yaml-flow", sub("  warp_size: 32\n", "  warp_size: [32\n"),
     "{p}:33: invalid YAML: expected ',' or ']', but got ':'"),
    ("invalid-yaml-indent", sub("  sub_partitions: 4\n", "   sub_partitions: 4\n"),
     "{p}:31: invalid YAML: mapping values are not allowed here"),
    ("invalid-yaml-tab", sub("  compute_units: 80\n", "\tcompute_units: 80\n"),
     "{p}:30: invalid YAML: found character '\\t' that cannot start any token"),
    ("top-level-list", whole("- a\n- b\n"),
     "{p}:1: expected a mapping at the top level, got [a, b]"),
    ("top-level-scalar", whole("just words\n"),
     "{p}:1: expected a mapping at the top level, got 'just words'"),
    ("empty-file", whole("# nothing here\n"),
     "{p}: empty file, expected a hardware description mapping"),
]


@pytest.mark.parametrize("edit,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed(tmp_path, capsys, edit, expected):
    path = tmp_path / "x.yaml"
    path.write_text(edit(BASE))
    code = main(["hw", "validate", str(path)])
    err = capsys.readouterr().err
    assert err == f"roller: error: {expected.format(p=path)}\n"
    assert code == 2


def test_enough_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


def test_base_is_valid(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text(BASE)
    assert main(["hw", "validate", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.yaml"
    assert main(["hw", "validate", str(path)]) == 2
    bundled = ", ".join(list_bundled())
    assert capsys.readouterr().err == f"roller: error: no hardware description '{path}' (bundled: {bundled})\n"


def test_unknown_bundled_name(capsys):
    assert main(["hw", "show", "v200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roller: error: no hardware description 'v200' (bundled: a100, h100,")


SET_CASES = [
    ("parallelism.warp_size=0", "--set parallelism.warp_size: expected a positive integer, got 0"),
    ("parallelism.warp_size=48",
     "{p}:33 parallelism.max_threads_per_block: expected a multiple of parallelism.warp_size (48), got 1024"),
    ("memory[1].capacity_per_block_bytes=1MiB",
     "--set memory[1].capacity_per_block_bytes: expected at most capacity_per_unit_bytes (96KiB), got 1MiB"),
    ("memory[1].bankz=3", "--set memory[1].bankz: unknown key; did you mean 'banks'?"),
    ("memory[7].banks=1", "--set memory[7]: no such entry in {p} (3 entries)"),
    ("bogus.x=1", "--set bogus: no such key in {p}"),
    ("warp_size", "--set: expected KEY=VALUE (e.g. parallelism.warp_size=64), got 'warp_size'"),
    ("memory[x].banks=1", "--set: expected a key path like memory[1].banks, got 'memory[x].banks'"),
    ("parallelism={compute_units: 1}", "--set parallelism: missing key 'sub_partitions'"),
]


@pytest.mark.parametrize("setting,expected", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_bad_override(tmp_path, capsys, setting, expected):
    path = tmp_path / "x.yaml"
    path.write_text(BASE)
    code = main(["hw", "validate", str(path), "--set", setting])
    assert capsys.readouterr().err == f"roller: error: {expected.format(p=path)}\n"
    assert code == 2


def test_messages_are_one_line(tmp_path, capsys):
    for name, edit, _ in CASES:
        path = tmp_path / f"{name}.yaml"
        path.write_text(edit(BASE))
        main(["hw", "validate", str(path)])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, name
        assert re.match(r"roller: error: \S+", err)
