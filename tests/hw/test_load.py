"""Loading hardware descriptions: bundled files, typed values, overrides, conveniences, schema.json."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from roller import backends, hw
from roller.errors import InputError
from roller.hw import (
    ComputePeak,
    DtypeCompute,
    HardwareDesc,
    MatrixInstruction,
    MemoryLayer,
    Parallelism,
    format_size,
    load,
    parse_size,
)

BUNDLED = ["a100", "h100", "h200", "ipu-gc2", "ipu-gc200", "mi100", "mi250x", "mi300x", "mi50", "pocl-cpu", "v100"]
REPO = Path(__file__).resolve().parents[2]


def test_list_bundled():
    assert hw.list_bundled() == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_loads_and_is_typed(name):
    d = load(name)
    assert isinstance(d, HardwareDesc)
    assert d.name == name
    assert d.backend in backends.registry()
    assert len(d.memory) >= 2
    assert d.memory[0].scope == "device" and d.memory[-1].scope == "thread"
    assert all(isinstance(m, MemoryLayer) for m in d.memory)
    assert isinstance(d.parallelism, Parallelism)
    assert isinstance(d.compute["float32"], DtypeCompute)
    for m in d.memory:
        assert isinstance(m.bandwidth_peak_gbps, float) and m.bandwidth_effective_gbps <= m.bandwidth_peak_gbps
        assert isinstance(m.transaction_bytes, int)
        if m.scope == "block":
            assert m.banks and m.bank_width_bytes and m.capacity_per_block_bytes <= m.capacity_per_unit_bytes
    for c in d.compute.values():
        assert isinstance(c.vector, ComputePeak) and c.vector.effective_tflops <= c.vector.peak_tflops
    for mi in d.matrix_instructions:
        assert isinstance(mi, MatrixInstruction) and len(mi.shape) == 3
        assert d.has_matrix(mi.input_dtype)


@pytest.mark.parametrize("name", BUNDLED)
def test_name_and_path_give_the_same_description(name, monkeypatch):
    monkeypatch.chdir(REPO)
    by_name = load(name)
    by_path = load(f"hwdesc/{name}.yaml")
    assert by_name == by_path
    assert by_path.source == f"hwdesc/{name}.yaml"
    assert hash(by_name) == hash(by_path)
    assert by_name.content_hash() == by_path.content_hash()


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_validates_against_json_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(hw.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    data = yaml.safe_load((hw.BUNDLED_DIR / f"{name}.yaml").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_values_carry_their_source(name):
    text = (hw.BUNDLED_DIR / f"{name}.yaml").read_text()
    assert text.startswith("#") and re.search(r"[Ss]ources?", text.split("name:")[0])
    for line in text.splitlines():
        if re.match(r"\s+(capacity_\w+|bandwidth_gbps|compute_units|registers_per_unit|register_tile_budget):", line):
            assert "#" in line, f"{name}: no source comment on {line.strip()!r}"


def test_roller_measured_values_are_effective():
    v100, mi50 = load("v100"), load("mi50")
    assert [m.bandwidth_effective_gbps for m in v100.memory[:2]] == [750, 12080]
    assert v100.compute["float32"].vector.effective_tflops == 12.48
    assert v100.parallelism.register_tile_budget == 96
    assert [m.bandwidth_effective_gbps for m in mi50.memory[:2]] == [900, 8000]
    assert mi50.compute["float32"].vector.effective_tflops == 12.0
    assert mi50.parallelism.register_tile_budget == 70
    assert mi50.parallelism.warp_size == 64 and mi50.target == "gfx906"


def test_specific_devices():
    v100 = load("v100")
    assert v100.layer("shared").capacity_per_block_bytes == 48 * 1024
    assert v100.layer("global").capacity_bytes == 16 * 2**30
    assert v100.memory[2].capacity_per_thread_bytes == 1020
    assert load("mi250x").parallelism.compute_units == 110          # one GCD
    assert load("mi250x").memory[0].capacity_bytes == 64 * 2**30
    assert load("h200").memory[0].capacity_bytes == 141 * 10**9
    gc2, gc200 = load("ipu-gc2"), load("ipu-gc200")
    assert gc2.parallelism.hardware_threads_per_unit == gc200.parallelism.hardware_threads_per_unit == 6
    assert gc2.layer("tile").capacity_per_block_bytes == 256 * 1024
    assert gc2.backend == gc200.backend == "poplar" and gc2.target == "ipu1" and gc200.target == "ipu2"
    assert load("v100").parallelism.hardware_threads_per_unit is None
    pocl = load("pocl-cpu")
    assert pocl.backend == "opencl" and [m.scope for m in pocl.memory] == ["device", "cache", "thread"]
    assert "cached RAM" in pocl.notes
    assert load("mi50").matrix_instructions == ()
    assert load("a100").matrix_instructions_for("bfloat16")


def test_conveniences():
    v100 = load("v100")
    assert v100.peak_flops("float32") == pytest.approx(12.48e12)
    assert v100.peak_flops("float32", peak=True) == pytest.approx(15.7e12)
    assert v100.peak_flops("float16", matrix=True) == pytest.approx(125e12)
    assert v100.bandwidth(0) == pytest.approx(750e9)
    assert v100.bandwidth("shared") == pytest.approx(12080e9)
    assert v100.bandwidth(0, peak=True) == pytest.approx(900e9)
    assert v100.layer(1).name == "shared" and v100.layer_index("register") == 2
    with pytest.raises(KeyError):
        v100.layer("l2")
    with pytest.raises(InputError, match="no compute entry for dtype 'bfloat16'"):
        v100.peak_flops("bfloat16")
    with pytest.raises(InputError, match="no matrix units"):
        load("mi50").peak_flops("float32", matrix=True)


def test_frozen():
    d = load("v100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.name = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.memory[0].banks = 3
    with pytest.raises(TypeError):
        d.compute["float64"] = d.compute["float32"]
    assert isinstance(d.memory, tuple)


@pytest.mark.parametrize("name", BUNDLED)
def test_to_dict_round_trip(name):
    d = load(name)
    again = hw.from_dict(d.to_dict())
    assert again == d
    assert again.content_hash() == d.content_hash()
    json.dumps(d.to_dict())


def test_content_hash_is_stable_and_sensitive():
    a = load("v100").content_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    assert a == load("v100").content_hash()
    assert a != load("v100", overrides={"parallelism.register_tile_budget": "64"}).content_hash()
    assert a != load("a100").content_hash()


def test_overrides():
    d = load("mi50", overrides={"memory[1].capacity_per_block_bytes": "32KiB", "parallelism.warp_size": "32",
                                "compute.float32.vector.effective_tflops": 10})
    assert d.memory[1].capacity_per_block_bytes == 32 * 1024
    assert d.parallelism.warp_size == 32
    assert d.compute["float32"].vector.effective_tflops == 10.0
    assert load("mi50").parallelism.warp_size == 64          # the cached original is untouched
    d = load("v100", overrides={"memory[0].bandwidth_gbps": "{peak: 1000, effective: 800}"})
    assert d.memory[0].bandwidth_peak_gbps == 1000 and d.memory[0].bandwidth_effective_gbps == 800
    with pytest.raises(InputError, match=r"^--set parallelism.warp_size: expected a positive integer, got 0$"):
        load("v100", overrides={"parallelism.warp_size": "0"})


@pytest.mark.parametrize("text,value", [
    ("96KiB", 98304), ("16GiB", 16 * 2**30), ("48KB", 48000), ("1MiB", 2**20), ("1 MiB", 2**20),
    ("1020", 1020), (4096, 4096), ("141GB", 141 * 10**9), ("1.5KiB", 1536), ("64B", 64), ("2TiB", 2 * 2**40),
    ("64kiB", 65536), ("lots", None), ("16QiB", None), ("1.3B", None), (True, None), ([1], None), ("", None),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_format_size():
    assert format_size(98304) == "96KiB"
    assert format_size(1020) == "1020"
    assert format_size(16 * 2**30) == "16GiB"
    assert format_size(None) == "null"


FOUR_LAYERS = """\
name: fictional-4
vendor: nobody
backend: hip
target: gfx1100
memory:
  - {name: hbm, scope: device, capacity_bytes: 8GiB, bandwidth_gbps: {peak: 500, effective: 400},
     transaction_bytes: 64, line_bytes: 128}
  - {name: l2, scope: cache, capacity_bytes: 4MiB, capacity_per_unit_bytes: 128KiB,
     bandwidth_gbps: {peak: 2000, effective: 1500}, transaction_bytes: 64, line_bytes: 128}
  - {name: lds, scope: block, capacity_per_unit_bytes: 128KiB, capacity_per_block_bytes: 64KiB,
     bandwidth_gbps: {peak: 8000, effective: 6000}, transaction_bytes: 4, line_bytes: 128, banks: 32,
     bank_width_bytes: 4}
  - {name: vgpr, scope: thread, capacity_per_unit_bytes: 192KiB, capacity_per_thread_bytes: 1KiB,
     bandwidth_gbps: {peak: 30000, effective: 30000}, transaction_bytes: 4, line_bytes: 4}
parallelism: {compute_units: 32, sub_partitions: 2, warp_size: 32, max_threads_per_block: 1024,
  max_threads_per_unit: 2048, max_blocks_per_unit: 32, registers_per_unit: 49152, max_registers_per_thread: 256,
  register_tile_budget: 64}
compute:
  float32: {vector: {peak_tflops: 20, effective_tflops: 18}}
"""


def test_four_layer_device_loads(tmp_path):
    path = tmp_path / "fictional.yaml"
    path.write_text(FOUR_LAYERS)
    d = load(str(path))
    assert [m.name for m in d.memory] == ["hbm", "l2", "lds", "vgpr"]
    assert d.memory[1].capacity_per_unit_bytes == 128 * 1024
    assert d.matrix_instructions == () and d.notes == ""
    assert d.source == str(path)


def test_load_text_and_anchors():
    text = FOUR_LAYERS.replace("compute:\n  float32: {vector: {peak_tflops: 20, effective_tflops: 18}}",
                               "compute:\n  float32: {vector: &p {peak_tflops: 20, effective_tflops: 18}}\n"
                               "  float64: {vector: *p}")
    d = hw.load_text(text, "inline.yaml")
    assert d.compute["float64"] == d.compute["float32"]


def test_docs_minimal_example_validates():
    text = (REPO / "docs" / "hwdesc.md").read_text()
    example = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)[-1]
    d = hw.load_text(example, "docs/hwdesc.md")
    assert d.name == "mygpu" and len(d.memory) == 3
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(hw.SCHEMA_PATH.read_text())).validate(yaml.safe_load(example))


def test_docs_mention_every_key():
    text = (REPO / "docs" / "hwdesc.md").read_text()
    from roller.hw.loader import LAYER_KEYS, PAR_KEYS, TOP_KEYS
    for key in (*TOP_KEYS, *LAYER_KEYS, *PAR_KEYS, "peak_tflops", "effective_tflops"):
        assert f"`{key}" in text, key
