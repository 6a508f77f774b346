"""`roller hw list|show|validate` and the shared --hw/--set helpers."""
from __future__ import annotations

import argparse
import json

import pytest
import yaml

from roller import hw
from roller.cli.common import add_hw_arguments, hw_from_args
from roller.cli.main import main
from roller.errors import InputError


def test_list_table(capsys):
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["NAME", "BACKEND", "TARGET"]
    names = [line.split()[0] for line in out[1:]]
    assert names == hw.list_bundled()
    v100 = next(line for line in out if line.startswith("v100 "))
    assert v100.split()[:5] == ["v100", "cuda", "sm_70", "80", "32"]
    assert "750" in v100.split() and "12080" in v100.split() and "12.48" in v100.split()


def test_list_json(capsys):
    assert main(["hw", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    mi50 = next(r for r in rows if r["name"] == "mi50")
    assert mi50["mem_gbps"] == 900 and mi50["smem_gbps"] == 8000 and mi50["warp"] == 64
    assert mi50["matrix_tflops"] is None


def test_show_yaml_round_trips(capsys, tmp_path):
    assert main(["hw", "show", "mi50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ")
    path = tmp_path / "shown.yaml"
    path.write_text(out)
    assert hw.load(str(path)) == hw.load("mi50")
    assert "capacity_per_block_bytes: 64KiB" in out


def test_show_json_with_set(capsys):
    assert main(["hw", "show", "v100", "--json", "--set", "parallelism.warp_size=64",
                 "--set", "memory[1].capacity_per_block_bytes=32KiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallelism"]["warp_size"] == 64
    assert data["memory"][1]["capacity_per_block_bytes"] == 32768


def test_show_file(capsys):
    path = str(hw.BUNDLED_DIR / "ipu-gc2.yaml")
    assert main(["hw", "show", path]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["parallelism"]["hardware_threads_per_unit"] == 6


def test_validate_all_bundled(capsys):
    files = [str(p) for p in sorted(hw.BUNDLED_DIR.glob("*.yaml"))]
    assert main(["hw", "validate", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(files) and all(line.startswith("ok  ") for line in out)


def test_validate_reports_every_bad_file(tmp_path, capsys):
    good = str(hw.BUNDLED_DIR / "v100.yaml")
    bad1, bad2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bad1.write_text("name: x\n")
    bad2.write_text("- 1\n")
    assert main(["hw", "validate", str(bad1), good, str(bad2)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"roller: error: {bad1}:1: missing key 'vendor'",
                                         f"roller: error: {bad2}:1: expected a mapping at the top level, got [1]"]
    assert captured.out.count("ok  ") == 1


def test_hw_without_action_prints_help(capsys):
    assert main(["hw"]) == 2
    assert "list" in capsys.readouterr().err


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_hw_arguments(parser)
    return parser


def test_hw_from_args():
    args = _parser().parse_args(["--hw", "mi50", "--set", "parallelism.register_tile_budget=64",
                                 "--set", "memory[1].capacity_per_block_bytes=32KiB"])
    d = hw_from_args(args)
    assert d.name == "mi50" and d.parallelism.register_tile_budget == 64
    assert d.memory[1].capacity_per_block_bytes == 32768
    assert hw_from_args(_parser().parse_args(["--hw", "v100"])) == hw.load("v100")


def test_hw_from_args_errors():
    with pytest.raises(InputError, match=r"^--set: expected KEY=VALUE"):
        hw_from_args(_parser().parse_args(["--hw", "v100", "--set", "oops"]))
    with pytest.raises(InputError, match=r"^no hardware description 'v999'"):
        hw_from_args(_parser().parse_args(["--hw", "v999"]))
    optional = argparse.ArgumentParser()
    add_hw_arguments(optional, required=False)
    with pytest.raises(InputError, match="missing --hw"):
        hw_from_args(optional.parse_args([]))
    defaulted = argparse.ArgumentParser()
    add_hw_arguments(defaulted, default="pocl-cpu")
    assert hw_from_args(defaulted.parse_args([])).name == "pocl-cpu"
