"""The table a GPU session prints last (bench/gpu_session.sh): from its output folder, the ceilings, each
category's geomean ratio (best of top-k and top-1, GEMMs also without M0, whose K = 2 makes it an epilogue
test) and every ablation against the same ops of the main run (Roller's time with the feature off / on).

``python bench/gpu_summary.py OUT_DIR``; needs no GPU.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import geomean  # bench/ is not a package


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(path.read_text())["rows"])
    except (OSError, ValueError, KeyError):
        return []


def categories(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per category: ops, correct, geomean of best-of-k and of top-1 ratios."""
    out = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["category"], []).append(r)
        if r["category"].startswith("gemm") and r["name"].split("_")[0] != "M0":
            groups.setdefault(r["category"] + " without M0", []).append(r)
    for cat, g in sorted(groups.items()):
        best = [r["ratio"] for r in g if r.get("ratio")]
        top1 = [r["ratio"] * r["roller_ms"] / r["top1_ms"] for r in g
                if r.get("ratio") and r.get("top1_ms") and r.get("roller_ms")]
        ok = sum(bool(r.get("ok")) for r in g)
        out.append(f"{cat:28s} {len(g):3d} ops {ok:3d} correct  best {geomean(best):.3f}  top-1 "
                   f"{geomean(top1):.3f}" if best else f"{cat:28s} {len(g):3d} ops {ok:3d} correct  no ratio")
    return out


def ablation(main: Sequence[dict[str, Any]], off: Sequence[dict[str, Any]]) -> list[str]:
    """Per op whose line differs: Roller's time with the feature off over with it on (above 1: it helped)."""
    on = {r["name"]: r for r in main}
    out, gains = [], []
    for r in off:
        m = on.get(r["name"])
        if not m or not m.get("roller_ms") or not r.get("roller_ms") or m.get("line") == r.get("line"):
            continue
        gains.append(r["roller_ms"] / m["roller_ms"])
        out.append(f"  {r['name']:10s} off {r['roller_ms']:.4f} ms  on {m['roller_ms']:.4f} ms  x{gains[-1]:.2f}")
    return out + [f"  {len(gains)} ops differ, geomean x{geomean(gains):.3f}" if gains else "  no op differs"]


def sass_flags(rows: Sequence[dict[str, Any]], hw: str, sass: dict[str, Any]) -> list[str]:
    """Per op: the fastest kernel's SASS features as the prepare step read them (.gpucarry/sass.json)."""
    out = []
    for r in rows:
        feats = sass.get(f"{hw}/{r['name']}", {}).get(r.get("line") or "", {})
        shown = " ".join(f"{k}={v}" for k, v in feats.items() if k != "problems" and v)
        out.append(f"  {r['name']:10s} ratio {r.get('ratio') or 0:.3f}  {shown or '(no SASS read)'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: bench/gpu_summary.py OUT_DIR (a bench/gpu_session.sh output folder)", file=sys.stderr)
        return 2
    out = Path(args[0])
    lines = ["== summary"]
    ceil = out / "ceilings.json"
    if ceil.exists():
        lines += [f"ceilings: {ceil.read_text()}"]
    quick = _rows(out / "gpu-quick.json")
    lines += ["quick:", *categories(quick)]
    sass = Path(".gpucarry/sass.json")
    if sass.exists() and quick:
        hw = json.loads((out / "gpu-quick.json").read_text())["meta"]["hw"]
        lines += ["quick, per op (fastest kernel's SASS):", *sass_flags(quick, hw, json.loads(sass.read_text()))]
    for r in _rows(out / "gpu-large.json"):
        lines.append(f"large {r['name']}: roller {r.get('roller_ms')} ms, {r.get('rate')}, ratio {r.get('ratio')}"
                     f", ok {r.get('ok')}, {r.get('line')}")
    for path in sorted(out.glob("ablate-*.json")):
        lines += [f"ablation {path.stem[len('ablate-'):]} (off / on):", *ablation(quick, _rows(path))]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
