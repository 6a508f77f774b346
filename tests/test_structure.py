"""The layering of the package and the contracts between its layers: public names, program serialisation,
the backend declarations, settings, description inheritance, and the import rules the core keeps."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import roller
from roller import backends, cache, settings
from roller.dtypes import OP_DTYPES
from roller.errors import InputError
from roller.hw import SCHEMA_PATH, list_bundled, load, load_text
from roller.ir import load_ops
from roller.program import RProgram

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "roller"


def _modules() -> list[str]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__":   # runs the command line when imported, as it should
            out.append(".".join(parts))
    return out


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False,
                          timeout=120)


# -- public names -------------------------------------------------------------------------------------------

PUBLIC_CHECK = """
import roller
for name in roller.__all__:
    if name != "__version__":
        assert callable(getattr(roller, name)) and not isinstance(getattr(roller, name), type(roller)), name
from roller import construct, compile, reference
assert callable(construct) and callable(compile) and callable(reference)
progs = roller.construct({"op": "matmul", "M": 64, "N": 64, "K": 64}, "v100", top_k=2)
progs2 = roller.construct({"op": "matmul", "M": 64, "N": 64, "K": 64}, "v100", top_k=2)
assert [p.line() for p in progs] == [p.line() for p in progs2] and len(progs) == 2
print("ok")
"""


@pytest.mark.parametrize("first", ["", "import roller.construction", "import roller.compiler.kernel",
                                   "import roller.construction as x", "from roller.construction import construct",
                                   "import roller.ir.reference, roller.ir, roller.perf.micro",
                                   "import roller; roller.compile({'op': 'matmul', 'M': 8, 'N': 8, 'K': 8}, hw='v100')"])
def test_public_names_stay_functions_in_every_import_order(first: str) -> None:
    """roller.construct once was the subpackage after any import of it (the second call, or the first after
    roller.compile, raised 'module object is not callable')."""
    proc = _run(f"{first}\n{PUBLIC_CHECK}")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_all_lists_the_lazy_names() -> None:
    assert set(roller.__all__) == {"__version__", *roller._LAZY}


def test_every_module_imports_alone() -> None:
    """Each module in a fresh interpreter (roller.perf.micro once failed on a circular import)."""
    def one(name: str) -> tuple[str, str]:
        proc = _run(f"import {name}")
        return name, "" if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1]

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(n, e) for n, e in pool.map(one, _modules()) if e]
    assert not failed


# -- layering -----------------------------------------------------------------------------------------------

# The layers, lowest first: a module imports only its own layer and the layers below (docs/design.md). Modules of
# one rank but different layers (construction and graph) import neither the other.
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (0, "base", ("roller", "roller.errors", "roller.settings", "roller.dtypes", "roller.atomic", "roller.progress",
                 "roller.cache")),
    (1, "ir", ("roller.ir",)),
    (2, "hw", ("roller.hw",)),
    (3, "program", ("roller.program",)),
    (4, "perf", ("roller.perf",)),
    (5, "construction", ("roller.construction",)),
    (5, "graph", ("roller.graph",)),
    (6, "runtime", ("roller.runtime",)),
    (7, "backends", ("roller.backends",)),
    (8, "frontends", ("roller.frontends",)),
    (9, "compiler", ("roller.compiler",)),
    (10, "compare", ("roller.compare",)),
    (11, "cli", ("roller.cli", "roller.__main__")),
]


def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    return ".".join(parts), package


def _layer(module: str) -> tuple[int, str]:
    best = None
    for rank, name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix != "roller":
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank, name)
    if best is None:
        assert module == "roller" or module.count(".") == 1, f"{module} is in no layer: add it to LAYERS"
        return 0, "base"
    return best[1], best[2]


def _graph() -> dict[str, list[tuple[int, str]]]:
    """Module -> (line, roller module) for every import in it: at the top, inside functions and under
    TYPE_CHECKING alike, relative ones resolved."""
    paths = {(_module_of(p)[0]): p for p in PKG.rglob("*.py")}

    def resolve(name: str) -> str:
        while name not in paths and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    out: dict[str, list[tuple[int, str]]] = {}
    for module, path in paths.items():
        package = _module_of(path)[1]
        found: list[tuple[int, str]] = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [(node.lineno, resolve(a.name)) for a in node.names if a.name.split(".")[0] == "roller"]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = module.split(".")[: len(module.split(".")) - node.level + (1 if package else 0)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                if base.split(".")[0] != "roller":
                    continue
                for a in node.names:
                    full = resolve(f"{base}.{a.name}")
                    found.append((node.lineno, full if full == f"{base}.{a.name}" else resolve(base)))
        out[module] = [(line, m) for line, m in found if m != module]
    return out


def test_every_module_imports_only_its_layer_and_below() -> None:
    """base < ir < hw < program < perf < {construction, graph} < runtime < backends < frontends < compiler <
    compare < cli, for every import of every module, those inside functions and under TYPE_CHECKING too."""
    bad = []
    for module, imports in _graph().items():
        rank, name = _layer(module)
        for line, target in imports:
            t_rank, t_name = _layer(target)
            if t_rank > rank or (t_rank == rank and t_name != name):
                bad.append(f"{module}:{line} ({name}) imports {target} ({t_name})")
    assert not bad, "\n".join(sorted(bad))


def test_no_module_imports_itself_through_others() -> None:
    """No circle of imports between modules of roller/ (Tarjan's strongly connected components)."""
    graph = {m: sorted({t for _, t in imports}) for m, imports in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles


def test_the_layer_check_finds_a_backward_import(tmp_path: Path) -> None:
    """The layering tests above fail on what they are for: an import of the compiler from the IR, one inside
    a function, and a circle."""
    assert _layer("roller.ir.expr") < _layer("roller.compiler.kernel")
    assert _layer("roller.graph.ir")[0] == _layer("roller.construction")[0]
    assert _layer("roller.graph.ir")[1] != _layer("roller.construction")[1]
    probe = PKG / "ir" / "zz_layer_probe.py"
    probe.write_text("def f() -> None:\n    from roller.compiler import kernel\n")
    try:
        found = _graph()["roller.ir.zz_layer_probe"]
        assert (2, "roller.compiler.kernel") in found
    finally:
        probe.unlink()


def _core_files() -> list[Path]:
    files = [p for d in ("ir", "construction", "perf", "hw", "graph", "runtime") for p in (PKG / d).rglob("*.py")]
    return files + [PKG / f for f in ("cache.py", "program.py", "dtypes.py", "settings.py", "errors.py",
                                      "atomic.py", "progress.py")]


def test_no_backend_name_in_the_core() -> None:
    """Only the backends' own declarations name them (docs and comments included)."""
    names = sorted(backends.registry())
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b", re.IGNORECASE)
    found = []
    for path in _core_files():
        # the settings by backend; the target languages' names; their functions' error limits
        if path.name in ("settings.py", "identifiers.py", "reference.py"):
            continue
        for i, text in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(text):
                found.append(f"{path.relative_to(ROOT)}:{i}: {text.strip()}")
    assert not found


# -- backend declarations -----------------------------------------------------------------------------------

def test_every_backend_declares_its_facts() -> None:
    for name, b in backends.registry().items():
        assert b.name == name and b.file_ext and b.target_pattern and b.target_hint
        assert set(b.dtypes) <= set(OP_DTYPES)
        assert set(b.cache_env) <= {k.env for k in settings.knobs()}, name
        for s in b.matrix_support:
            assert s.family in ("wmma", "mfma") and s.input_dtype in b.dtypes
    for hw in list_bundled():
        d = load(hw)
        assert backends.for_hw(d).matches_target(d.target), hw


def test_schema_backend_rules_come_from_the_declarations() -> None:
    """roller/hwdesc/schema.json restates the declarations; scripts/update_schema.py rewrites it."""
    schema = json.loads(SCHEMA_PATH.read_text())
    names, rules = backends.schema_rules()
    assert schema["properties"]["backend"] == {"enum": names}, "run scripts/update_schema.py"
    ours = [r for r in schema["allOf"] if str(r.get("$comment", "")).startswith("backend ")]
    assert ours == rules, "run scripts/update_schema.py"


def test_a_description_for_an_unknown_backend_or_target_is_refused() -> None:
    text = (ROOT / "roller/hwdesc/v100.yaml").read_text()
    with pytest.raises(InputError, match=r"backend: expected one of cuda, hip, opencl, poplar, got 'vulkan'"):
        load_text(text.replace("backend: cuda", "backend: vulkan"), "x.yaml")
    with pytest.raises(InputError, match=r"target: expected a CUDA target like sm_70 for backend 'cuda'"):
        load_text(text.replace("target: sm_70", "target: gfx906"), "x.yaml")


# -- settings -----------------------------------------------------------------------------------------------

def test_every_roller_variable_is_declared_once_and_read_through_settings() -> None:
    declared = {k.env for k in settings.knobs()}
    assert len(declared) == len(settings.knobs())
    used, direct = set(), []
    for path in PKG.rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r"\bROLLER_[A-Z_]+\b", text))
        if path.name != "settings.py":
            direct += [f"{path.relative_to(ROOT)}: {m}" for m in
                       re.findall(r"environ(?:\.get)?\(?\[?[\"'](ROLLER_[A-Z_]+)", text)]
    used.discard("ROLLER_MFMA_TYPES")   # a preprocessor guard in generated HIP source, not a variable
    assert used <= declared, used - declared
    assert not direct


def test_settings_read_the_environment_at_each_access(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = settings.settings
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "a"))
    assert s.cache.dir == tmp_path / "a"
    monkeypatch.setenv("ROLLER_NO_CACHE", "yes")
    assert s.cache.disabled and not cache.enabled()
    monkeypatch.setenv("ROLLER_NO_CACHE", "0")
    assert not s.cache.disabled
    monkeypatch.delenv("ROLLER_POPLAR_DEVICE", raising=False)
    assert s.poplar.device == "model"


@pytest.mark.parametrize("value", ["banana", "2", "ture", "-1"])
def test_a_switch_set_to_anything_else_is_an_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Not a silent "off": ROLLER_CL_FAST_MATH=banana names itself (the CLI's exit 2)."""
    from roller.errors import InputError

    monkeypatch.setenv("ROLLER_CL_FAST_MATH", value)
    with pytest.raises(InputError, match=rf"ROLLER_CL_FAST_MATH='{value}': expected one of 1, true, yes, on, 0"):
        _ = settings.settings.opencl.fast_math
    for word, on in [("ON", True), ("Off", False), (" yes ", True), ("0", False)]:
        monkeypatch.setenv("ROLLER_CL_FAST_MATH", word)
        assert settings.settings.opencl.fast_math is on


# -- programs serialise themselves --------------------------------------------------------------------------

CONV = {"op": "conv2d", "N": 1, "C": 8, "H": 12, "W": 12, "F": 16, "KH": 3, "KW": 3}
MM16 = {"op": "matmul", "M": 256, "N": 256, "K": 256, "dtype": "float16"}
ROUND_TRIP = [  # (op, description, another op of the same kind)
    (CONV, "ipu-gc200", dict(CONV, N=2)),  # direct convolution
    (CONV, "mi50", dict(CONV, N=2)),  # implicit GEMM
    ({"op": "reduce", "kind": "sum", "shape": [6, 7, 8], "axes": [1, 2]}, "pocl-cpu",
     {"op": "reduce", "kind": "sum", "shape": [6, 7, 9], "axes": [1, 2]}),  # fused axes
    (MM16, "h100", dict(MM16, M=128)),  # wmma
    (MM16, "mi100", dict(MM16, M=128)),  # mfma
]


def _same_prediction(a: object, b: object) -> bool:
    """Equal but for the last bits of times written in milliseconds and read back in seconds."""
    import dataclasses
    import math

    da, db = dataclasses.asdict(a), dataclasses.asdict(b)  # type: ignore[call-overload]
    for key in da:
        x, y = da[key], db[key]
        if isinstance(x, float):
            if not math.isclose(x, y, rel_tol=1e-12):
                return False
        elif key == "layer_times_s":
            if [n for n, _ in x] != [n for n, _ in y] or \
                    not all(math.isclose(u, v, rel_tol=1e-12) for (_, u), (_, v) in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("spec,hw,other_spec", ROUND_TRIP, ids=[f"{s['op']}-{h}" for s, h, _ in ROUND_TRIP])
def test_rprogram_round_trips_through_json(spec: dict, hw: str, other_spec: dict) -> None:
    op = load_ops(spec)[0]
    for p in roller.construct(op, hw, top_k=5):
        doc = json.loads(p.dumps())
        back = RProgram.from_json(doc, op)
        assert back == p and _same_prediction(back.prediction, p.prediction)
        # without the op: the same program of the same expression (read back as a generic op)
        alone = RProgram.from_json(doc)
        assert alone.expr.content_hash() == p.expr.content_hash() and alone.expr.statement() == p.expr.statement()
        assert (alone.tiles, alone.grid, alone.block, alone.matrix) == (p.tiles, p.grid, p.block, p.matrix)
    other = load_ops(other_spec)[0]
    with pytest.raises(ValueError, match="another op"):
        RProgram.from_json(doc, other)


def test_ipu_convolution_is_a_cache_hit_the_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exchange-fed description keeps convolutions direct; reloading once re-derived the implicit GEMM,
    so every call rebuilt the entry and reported it damaged."""
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path))
    op = {"op": "conv2d", "N": 1, "C": 8, "H": 12, "W": 12, "F": 16, "KH": 3, "KW": 3}
    first = roller.compile(op, hw="ipu-gc200")
    assert not first.cache_hit and cache.last_event == "miss"
    for _ in range(2):
        again = roller.compile(op, hw="ipu-gc200")
        assert again.cache_hit and cache.last_event == "hit"
        assert again.program == first.program and again.source == first.source


# -- matrix instructions: one search, offered where the backend renders them ---------------------------------

def test_mfma_programs_are_constructed_for_amd_float16_gemms() -> None:
    op = {"op": "matmul", "M": 1024, "N": 1024, "K": 1024, "dtype": "float16"}
    for hw in ("mi100", "mi250x", "mi300x"):
        progs = roller.construct(op, hw, top_k=10)
        assert progs[0].matrix is not None and progs[0].matrix.family == "mfma", hw
        assert progs[0].prediction.time_s < min(p.prediction.time_s for p in progs if p.matrix is None) \
            if any(p.matrix is None for p in progs) else True
    # OpenCL renders no matrix program: the same op for the same description gets scalar programs there
    assert all(p.matrix is None for p in roller.construct(op, "mi100", top_k=10, backend="opencl"))
    # float32 on AMD: the description lists float32 MFMA shapes, which the HIP backend does not render
    f32 = dict(op, dtype="float32")
    assert all(p.matrix is None for p in roller.construct(f32, "mi100", top_k=10))


@pytest.mark.hipcc
def test_roller_build_renders_and_compiles_mfma_for_mi100(tmp_path: Path) -> None:
    from roller.backends.rocm_hip import hipcc
    from roller.cli.main import main

    try:
        hipcc.find()
    except Exception as err:  # noqa: BLE001 - no hipcc here
        pytest.skip(str(err))
    opfile = tmp_path / "mm.json"
    opfile.write_text(json.dumps({"name": "mm16", "op": "matmul", "M": 1024, "N": 1024, "K": 1024,
                                  "dtype": "float16"}))
    out = tmp_path / "out"
    assert main(["build", "--hw", "mi100", str(opfile), "-o", str(out)]) == 0
    launch = json.loads((out / "mm16" / "launch.json").read_text())
    assert launch["matrix_instruction"] and launch["matrix_instruction"].startswith("mfma_")
    source = (out / "mm16" / "kernel.hip").read_text()
    assert "__builtin_amdgcn_mfma_f32_" in source
    hw = load("mi100")
    prog = RProgram.from_json(json.loads((out / "mm16" / "rprogram.json").read_text()))
    art = backends.get("hip").render(prog, hw)
    usage = backends.get("hip").check_compiles(art, hw, tmp_path / "check")
    lds = next(m for m in hw.memory if m.scope == "block")
    assert usage["lds_bytes"] <= lds.capacity_per_block_bytes
    assert usage["vgprs"] + usage.get("agprs", 0) <= hw.parallelism.max_registers_per_thread
    assert usage["vgpr_spills"] == 0 and usage.get("mfma", 0) > 0


# -- descriptions that extend another ------------------------------------------------------------------------

def test_h200_is_the_h100_with_what_differs() -> None:
    h100, h200 = load("h100"), load("h200")
    assert "extends: h100.yaml" in (ROOT / "roller/hwdesc/h200.yaml").read_text()
    assert h200.memory[0].capacity_bytes == 141 * 10**9 and h200.memory[0].bandwidth_peak_gbps == 4800
    assert h200.memory[1:] == h100.memory[1:] and h200.parallelism == h100.parallelism
    assert h200.compute["float16"].matrix.peak_tflops == 989
    assert h200.compute["float16"].vector == h100.compute["float16"].vector
    assert h200.matrix_instructions == h100.matrix_instructions


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_extends_merges_and_reports_the_file_each_value_came_from(tmp_path: Path) -> None:
    base = (ROOT / "roller/hwdesc/v100.yaml").read_text()
    _write(tmp_path, "base.yaml", base)
    child = _write(tmp_path, "child.yaml", "extends: base.yaml\nname: child\nmemory:\n"
                                           "  - name: shared\n    banks: 16\n")
    d = load(child)
    assert d.name == "child" and d.layer("shared").banks == 16 and d.layer("shared").scope == "block"
    assert d.parallelism == load("v100").parallelism and d.layer("global") == load("v100").layer("global")
    # a bad value given by the child: the child's file and line
    bad = _write(tmp_path, "bad.yaml", "extends: base.yaml\nname: bad\nparallelism:\n  warp_size: 0\n")
    with pytest.raises(InputError) as err:
        load(bad)
    assert str(err.value).startswith(f"{bad}:4 parallelism.warp_size: expected a positive integer")
    # a bad value inherited from the parent: the parent's file and line
    _write(tmp_path, "badbase.yaml", base.replace("warp_size: 32", "warp_size: 0"))
    child2 = _write(tmp_path, "child2.yaml", "extends: badbase.yaml\nname: c2\n")
    line = next(i for i, t in enumerate(base.splitlines(), 1) if t.strip().startswith("warp_size:"))
    with pytest.raises(InputError) as err:
        load(child2)
    assert f"badbase.yaml:{line} parallelism.warp_size" in str(err.value)
    # a bundled name works too, and a new layer name is appended (and then checked as a whole)
    d3 = load(_write(tmp_path, "b.yaml", "extends: h100\nname: b\nnotes: x\n"))
    assert d3.memory == load("h100").memory


@pytest.mark.parametrize("text,message", [
    ("extends: loop.yaml\nname: loop\n", "expected no loop of extends"),
    ("extends: nothing-like-this\nname: x\n", "no hardware description 'nothing-like-this'"),
    ("extends: h100\nvendor: x\n", "missing key 'name'"),
    ("extends: [h100]\nname: x\n", "extends: expected the name or path of a description"),
])
def test_extends_errors(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, "loop.yaml", text)
    with pytest.raises(InputError, match=re.escape(message)):
        load(path)


# -- the shared element-type table --------------------------------------------------------------------------

def test_one_dtype_table() -> None:
    import numpy as np

    from roller.dtypes import DTYPES, dtype

    assert all(set(load(h).compute) <= set(DTYPES) for h in list_bundled())
    x = np.array([1.0, -2.5, 3.140625, 65280.0], np.float32)   # exactly representable in bfloat16
    b = dtype("bfloat16")
    assert b.to_storage(x).dtype == np.uint16 and np.array_equal(b.from_storage(b.to_storage(x)), x)
    found = []
    for path in PKG.rglob("*.py"):
        if path.name == "dtypes.py":
            continue
        if re.search(r"\{\s*\"float32\":\s*np\.float32", path.read_text()):
            found.append(str(path.relative_to(ROOT)))
    assert not found


def test_cache_dir_is_private_to_the_test(tmp_path: Path) -> None:
    """tests/conftest.py points ROLLER_CACHE_DIR at a folder of the test's own."""
    assert os.environ.get("ROLLER_CACHE_DIR")
    assert Path(os.environ["ROLLER_CACHE_DIR"]).resolve() != (Path.home() / ".cache" / "roller").resolve()
