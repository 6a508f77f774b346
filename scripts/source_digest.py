"""Digest of what Roller generates, to show that a refactor changes no output.

    .venv/bin/python scripts/source_digest.py -o before.json            # on the old commit
    .venv/bin/python scripts/source_digest.py -o after.json --compare before.json

For a fixed sample of ops (the paper suite, the scaled suite, the fused suite and the examples) on every
bundled description, with the description's own backend and with OpenCL (which renders any description), it
constructs the top-K programs and renders each: every file's sha256, the launch description and the program's
line are recorded per (description, backend, op, rank). ``--models`` adds whole models built with ``roller
build`` (every file of the build folder but ``model.json``'s source path). ``--compare`` prints what differs
and exits 1 when anything does.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("bench/suites/roller119.json", "bench/suites/scaled.json", "bench/suites/fused.json")
MODELS = (("examples/models/mini_resnet.onnx", "pocl-cpu"), ("examples/models/mini_resnet.onnx", "h100"),
          ("examples/models/mini_resnet.onnx", "mi50"))
ZOO_HWS = ("pocl-cpu", "h100")   # every graph of tests/support/zoo_graphs.py (fusion, padding, layouts, attention)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ops(every: int) -> list[Any]:
    import roller

    ops = []
    for suite in SUITES:
        ops += roller.load_ops(str(ROOT / suite))
    for path in sorted((ROOT / "examples").glob("*.json")):
        ops += roller.load_ops(str(path))
    return ops[::every]


def programs(top_k: int, every: int) -> dict[str, Any]:
    import roller
    from roller import backends
    from roller.errors import RollerError
    from roller.hw import list_bundled, load

    out: dict[str, Any] = {}
    ops = _ops(every)
    for name in list_bundled():
        hwd = load(name)
        for be_name in dict.fromkeys((hwd.backend, "opencl")):
            be = backends.get(be_name)
            for op in ops:
                key = f"{name}/{be_name}/{op.name}"
                try:
                    progs = roller.construct(op, hwd, top_k=top_k, backend=be_name)
                except RollerError as err:
                    out[key] = {"error": str(err)}
                    continue
                for rank, prog in enumerate(progs):
                    try:
                        art = be.render(prog, hwd)
                    except RollerError as err:
                        out[f"{key}/{rank}"] = {"line": prog.line(), "error": str(err)}
                        continue
                    out[f"{key}/{rank}"] = {"line": prog.line(),
                                            "files": {f: _sha(t) for f, t in sorted(art.files.items())},
                                            "launch": _sha(json.dumps(art.launch, sort_keys=True))}
    return out


def _model_files() -> list[tuple[Path, str]]:
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    import onnx
    from zoo_graphs import ALL

    folder = Path(tempfile.mkdtemp(prefix="roller-digest-"))
    out = [(ROOT / path, hw) for path, hw in MODELS]
    for name, build in ALL.items():
        proto, _ = build()
        onnx.save(proto, str(folder / f"{name}.onnx"))
        out += [(folder / f"{name}.onnx", hw) for hw in ZOO_HWS]
    return out


def models() -> dict[str, Any]:
    from roller.cli.main import main

    out: dict[str, Any] = {}
    for path, hw in _model_files():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "build"
            rc = main(["build", "--hw", hw, str(path), "-o", str(folder)])
            files: dict[str, str] = {}
            for f in sorted(folder.rglob("*")):
                if not f.is_file():
                    continue
                rel = f.relative_to(folder).as_posix()
                if rel in ("model.json", "plan.json"):
                    files[rel] = _sha(json.dumps(_as_before(rel, json.loads(f.read_text())), sort_keys=True))
                elif f.suffix == ".npz":
                    import numpy as np

                    with np.load(f) as data:
                        files[rel] = _sha("".join(k + hashlib.sha256(data[k].tobytes()).hexdigest()
                                                  for k in sorted(data.files)))
                else:
                    files[rel] = _sha(f.read_text())
            out[f"model/{path.stem}/{hw}"] = {"rc": rc, "files": files}
    return out


def _as_before(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A build folder's document without what differs by design: the model file's path, and the keys added so
    that the folder loads back (``roller.load``): the values' shapes and types, the padded buffers' and inputs'
    padding, the description's hash and file, the model file's sha256."""
    doc = dict(doc)
    for key in ("source", "hw_hash", "hw_source", "source_sha256", "source_file", "values"):
        doc.pop(key, None)
    if name == "plan.json":
        doc["inputs"] = [{**e, "pad": {k: v for k, v in e["pad"].items() if k not in ("value", "dtype")}}
                         if "pad" in e else e for e in doc["inputs"]]
        doc["buffers"] = [{k: v for k, v in b.items() if k not in ("shape", "before", "after")}
                          for b in doc["buffers"]]
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True, help="JSON file to write")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--every", type=int, default=1, help="every Nth op of the sample (default: all)")
    ap.add_argument("--models", action="store_true",
                    help="also whole models built with roller build (examples/models, tests/support/zoo_graphs.py)")
    ap.add_argument("--compare", metavar="BEFORE.json", help="report differences from an earlier digest")
    args = ap.parse_args()
    t = time.perf_counter()
    doc = programs(args.top_k, args.every)
    if args.models:
        doc.update(models())
    Path(args.output).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    rendered = sum(1 for k, v in doc.items() if "files" in v and not k.startswith("model/"))
    by_backend: dict[str, int] = {}
    for k, v in doc.items():
        if "files" in v and not k.startswith("model/"):
            by_backend[k.split("/")[1]] = by_backend.get(k.split("/")[1], 0) + 1
    print(f"{rendered} programs rendered ({', '.join(f'{b} {n}' for b, n in sorted(by_backend.items()))}) "
          f"in {time.perf_counter() - t:.0f} s; wrote {args.output}")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())
    differ = sorted(k for k in set(before) | set(doc) if before.get(k) != doc.get(k))
    for k in differ[:40]:
        print(f"differs: {k}\n  before {before.get(k)}\n  after  {doc.get(k)}")
    print(f"{len(differ)} of {len(set(before) | set(doc))} entries differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
