"""Hardware descriptions: one YAML file per accelerator (roller/hwdesc/*.yaml), loaded into frozen objects.

>>> from roller import hw
>>> v100 = hw.load("v100")                       # bundled name, or a path to a YAML file
>>> v100.layer("shared").capacity_per_block_bytes
49152
"""
from __future__ import annotations

from roller.hw.desc import (
    DTYPES,
    SCOPES,
    Calibration,
    ComputePeak,
    DtypeCompute,
    HardwareDesc,
    MatrixInstruction,
    MemoryLayer,
    Parallelism,
    TileThroughput,
)
from roller.hw.loader import (
    BUNDLED_DIR,
    format_size,
    from_dict,
    list_bundled,
    load,
    load_text,
    parse_overrides,
    parse_size,
)
from roller.hw.rules import SCHEMA_PATH, BackendRule, backend_rules

__all__ = [
    "BUNDLED_DIR",
    "DTYPES",
    "SCHEMA_PATH",
    "SCOPES",
    "BackendRule",
    "Calibration",
    "ComputePeak",
    "DtypeCompute",
    "HardwareDesc",
    "MatrixInstruction",
    "MemoryLayer",
    "Parallelism",
    "TileThroughput",
    "backend_rules",
    "format_size",
    "from_dict",
    "list_bundled",
    "load",
    "load_text",
    "parse_overrides",
    "parse_size",
]
