"""Cross-device summaries of the entries: geomean time ratios per op kind, device-pair ratios, bottleneck
counts, and the model error where measured."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def by_op(entries: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{op: {hw: entry}}."""
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in entries:
        out[e["op"]][e["hw"]] = e
    return out


def kind_ratios(entries: list[dict[str, Any]], devices: list[str], baseline: str) -> list[dict[str, Any]]:
    """Per op kind (then all ops): geomean over the kind's ops of predicted time on each device divided by
    the baseline's; below 1 is faster than the baseline."""
    table = by_op(entries)
    kinds: dict[str, list[str]] = defaultdict(list)
    for op, per_hw in table.items():
        kinds[next(iter(per_hw.values()))["kind"]].append(op)
    rows = []
    for kind, ops in sorted(kinds.items()) + [("all ops", list(table))]:
        ratios = {}
        for d in devices:
            ratios[d] = geomean([table[o][d]["predicted_ms"] / table[o][baseline]["predicted_ms"] for o in ops
                                 if table[o][d]["predicted_ms"] and table[o][baseline]["predicted_ms"]])
        fastest = Counter(min(devices, key=lambda d: table[o][d]["predicted_ms"] or math.inf) for o in ops)
        rows.append({"kind": kind, "ops": len(ops), "ratio": ratios, "fastest": dict(fastest)})
    return rows


def pair_ratios(entries: list[dict[str, Any]], devices: list[str]) -> dict[str, dict[str, float | None]]:
    """``m[a][b]``: geomean over all ops of predicted time on ``a`` / on ``b``."""
    table = by_op(entries)
    return {a: {b: geomean([t[a]["predicted_ms"] / t[b]["predicted_ms"] for t in table.values()
                            if t[a]["predicted_ms"] and t[b]["predicted_ms"]]) for b in devices} for a in devices}


def device_summary(entries: list[dict[str, Any]], devices: list[str]) -> dict[str, dict[str, Any]]:
    """Per device: total predicted time, geomean fraction of peak, bottleneck counts, code generation
    statuses, construction time, and the model error over the measured ops."""
    out = {}
    for d in devices:
        es = [e for e in entries if e["hw"] == d]
        meas = [e["measured"] for e in es if e["measured"]]
        errs = [m["model_error"] for m in meas if m["model_error"]]
        out[d] = {
            "ops": len(es),
            "total_predicted_ms": sum(e["predicted_ms"] or 0 for e in es),
            "geomean_fraction_of_peak": geomean([e["fraction_of_peak"] for e in es]),
            "bottlenecks": dict(Counter(e["bottleneck"] for e in es).most_common()),
            "codegen": dict(Counter(e["codegen"]["status"] for e in es).most_common()),
            "construction_ms": sum(e["construction_ms"] for e in es),
            "codegen_ms": sum(e["codegen"].get("ms") or 0 for e in es),
            "measured": len(meas),
            "geomean_model_error": geomean(errs),
            "worst_model_error": max(errs) if errs else None,
        }
    return out
