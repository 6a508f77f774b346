"""Why construction decisions differ between devices, in words generated from the data.

Each device is compared with the baseline (the first ``--hw``). For every op whose chosen tiles differ, the
construction rules are re-checked against both descriptions to find which one forces the difference:

* capacity: one device's block tile does not fit the other's block memory (shared memory / LDS / tile SRAM);
* hierarchy: one description has a software-managed block layer and the other a cache;
* transactions: an axis that is contiguous in memory is aligned to a different element count (rule b);
* threads: the block's thread count follows another warp x scheduler multiple or thread limit (rule a);
* registers: one device's register tile exceeds the other's register-tile budget;
* parallelism: one device's tile would leave units of the other idle, so it was shrunk (scale-out);
* balance: tiles grow until compute time covers memory time, at another FLOP/byte ridge point;
* otherwise the model simply ranked another candidate first.

An op can have several reasons; each reason is counted once per op and illustrated with one example.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from roller.compare.facts import tile_grid
from roller.hw.loader import format_size

REASONS = ("capacity", "hierarchy", "transactions", "threads", "registers", "parallelism", "balance", "ranking")

TITLES = {
    "capacity": "block-memory capacity",
    "hierarchy": "memory hierarchy",
    "transactions": "memory transaction size",
    "threads": "threads per block",
    "registers": "register budget",
    "parallelism": "number of compute units",
    "balance": "compute / bandwidth balance",
    "ranking": "model ranking",
}


@dataclass
class Reason:
    key: str
    title: str
    rule: str  # the construction rule, in one sentence
    ops: list[str] = field(default_factory=list)
    example: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "rule": self.rule, "count": len(self.ops), "ops": self.ops,
                "example": self.example}


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1024 and n % 1024 == 0:
        return format_size(n)
    if n >= 1024:
        return f"{n / 1024:.1f}KiB"
    return f"{n} B"


def _warp_word(d: dict[str, Any]) -> str:
    return {"amd": "wavefronts", "graphcore": "worker threads"}.get(d["vendor"], "warps")


def _warps(d: dict[str, Any]) -> str:
    if d["warp_size"] == 1:
        return f"{d['name']} schedules single threads (no warps), so any thread count fills it"
    return (f"{d['name']} issues {_warp_word(d)} of {d['warp_size']} threads on {d['sub_partitions']} "
            f"scheduler{'s' if d['sub_partitions'] > 1 else ''} per unit (blocks in multiples of "
            f"{d['warp_multiple']} threads)")


def _tile(shape: list[int]) -> str:
    return "x".join(str(s) for s in shape)


def _unit_word(d: dict[str, Any]) -> str:
    return {"nvidia": "SMs", "amd": "CUs", "graphcore": "tiles"}.get(d["vendor"], "cores")


def description_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The description fields that feed construction and differ between devices ``a`` and ``b``."""
    out = []
    if (a["warp_size"], a["sub_partitions"]) != (b["warp_size"], b["sub_partitions"]):
        out.append(f"{_warps(b)}; {_warps(a)}")
    if a["max_threads_per_block"] != b["max_threads_per_block"]:
        out.append(f"at most {b['max_threads_per_block']} threads per block on {b['name']}, "
                   f"{a['max_threads_per_block']} on {a['name']}")
    if a["transaction_bytes"] != b["transaction_bytes"]:
        out.append(f"{b['outer_layer']} memory is read in {b['transaction_bytes']}-byte transactions on {b['name']}, "
                   f"{a['transaction_bytes']}-byte on {a['name']}")
    if a["staged_scope"] != b["staged_scope"]:
        for d in (b, a):
            if d["staged_scope"] == "block":
                out.append(f"{d['name']} stages block tiles in software-managed {d['staged_layer']} memory")
            else:
                out.append(f"{d['name']} has no software-managed block memory: blocks read through its "
                           f"{d['staged_layer']} {d['staged_scope']}")
    elif a["block_capacity_bytes"] != b["block_capacity_bytes"]:
        out.append(f"a block may use {_size(b['block_capacity_bytes'])} of {b['staged_layer']} memory on "
                   f"{b['name']}, {_size(a['block_capacity_bytes'])} of {a['staged_layer']} on {a['name']}")
    if a["register_tile_budget"] != b["register_tile_budget"]:
        out.append(f"a thread's register tile holds up to {b['register_tile_budget']} elements on {b['name']}, "
                   f"{a['register_tile_budget']} on {a['name']}")
    if a["compute_units"] != b["compute_units"]:
        out.append(f"{b['compute_units']} {_unit_word(b)} on {b['name']}, {a['compute_units']} {_unit_word(a)} "
                   f"on {a['name']}")
    ra, rb = a["ridge_flop_per_byte"], b["ridge_flop_per_byte"]
    if abs(math.log(rb / ra)) > math.log(1.15):
        out.append(f"compute and {b['outer_layer']} bandwidth balance at {rb:.3g} FLOP/byte on {b['name']} "
                   f"({b['fp32_tflops']:.3g} TFLOP/s, {b['global_gbps']:.4g} GB/s), {ra:.3g} on {a['name']} "
                   f"({a['fp32_tflops']:.3g} TFLOP/s, {a['global_gbps']:.4g} GB/s)")
    return out


def _rules(a: dict[str, Any], b: dict[str, Any]) -> dict[str, str]:
    return {
        "capacity": "a block tile's staged inputs must fit the memory one block may use",
        "hierarchy": "a cache is read through, not staged into: a block walks the whole reduction at once",
        "transactions": "an axis contiguous in memory is tiled in multiples of one transaction "
                        f"({a['transaction_bytes']} B on {a['name']}, {b['transaction_bytes']} B on {b['name']})",
        "threads": "a block's thread count is a multiple of warp size x schedulers and within the thread limit",
        "registers": "a thread's register tile stays within the register-tile budget",
        "parallelism": "a tile is shrunk until there is at least one block per compute unit",
        "balance": "a tile grows until its compute time covers its memory time (the ridge point)",
        "ranking": "both devices allow each other's tile; the model ranked another candidate first",
    }


def _axis_note(fa: dict[str, Any], ax: str) -> str:
    return f"axis {ax}" + (" (reduction)" if ax in fa["reduce_axes"] else "")


def _reasons_for(op: str, ea: dict[str, Any], eb: dict[str, Any], a: dict[str, Any], b: dict[str, Any]
                 ) -> dict[str, str]:
    """{reason key: example sentence} for one op whose tiles differ on devices ``a`` and ``b``."""
    fa, fb = ea["facts"], eb["facts"]
    out: dict[str, str] = {}
    na, nb = a["name"], b["name"]
    ba, bb, ta, tb = fa["block_tile"], fb["block_tile"], fa["thread_tile"], fb["thread_tile"]
    if a["staged_scope"] != b["staged_scope"]:
        cache = b if b["staged_scope"] != "block" else a
        ec = eb if cache is b else ea
        out["hierarchy"] = (f"{op}: on {cache['name']} a block reads through the {cache['staged_layer']} "
                            f"{cache['staged_scope']} with tile {_tile(ec['facts']['block_tile'])}")
    else:
        for (x, fx, dy) in ((na, fa, b), (nb, fb, a)):
            cap = dy["block_capacity_bytes"]
            if cap and fx["footprint_bytes"] and fx["footprint_bytes"] > cap:
                out["capacity"] = (f"{op}: {x}'s block tile {_tile(fx['block_tile'])} stages "
                                   f"{_size(fx['footprint_bytes'])}, more than the {_size(cap)} a block may use on "
                                   f"{dy['name']}")
                break
    for ax, ext, xa, xb in zip(fa["axes"], fa["extents"], ba, bb):
        ala, alb = fa["alignment"].get(ax, 1), fb["alignment"].get(ax, 1)
        # The rule shaped a size when the size is a multiple of an alignment > 1 short of the whole axis.
        shaped = [(al > 1 and x < ext and x % al == 0) for al, x in ((ala, xa), (alb, xb))]
        if ala != alb and xa != xb and any(shaped):
            def part(al: int, x: int, d: dict[str, Any], ext: int = ext) -> str:
                if x >= ext:
                    return f"{d['name']} covers the whole axis ({x})"
                if al > 1:
                    return f"{d['name']} tiles it in multiples of {al} ({d['transaction_bytes']} B): {x}"
                return f"{d['name']} has no alignment ({d['transaction_bytes']}-byte transactions): {x}"
            out["transactions"] = (f"{op}: {_axis_note(fa, ax)} is contiguous in memory; {part(ala, xa, a)}, "
                                   f"{part(alb, xb, b)}")
            break

    def shaped_threads(f: dict[str, Any], d: dict[str, Any]) -> bool:
        return f["threads"] >= d["max_threads_per_block"] or (
            d["warp_multiple"] > 1 and f["threads"] % d["warp_multiple"] == 0)

    if fa["threads"] != fb["threads"] and (a["warp_multiple"] != b["warp_multiple"]
                                           or a["max_threads_per_block"] != b["max_threads_per_block"]) and (
            shaped_threads(fa, a) or shaped_threads(fb, b)):
        def desc(f: dict[str, Any], d: dict[str, Any]) -> str:
            if f["threads"] >= d["max_threads_per_block"]:
                return f"{f['threads']} threads on {d['name']} (its limit)"
            if d["warp_multiple"] > 1 and f["threads"] % d["warp_multiple"] == 0:
                return (f"{f['threads']} threads on {d['name']} ({f['threads'] // d['warp_multiple']} x "
                        f"{d['warp_multiple']})")
            return f"{f['threads']} threads on {d['name']}"
        out["threads"] = f"{op}: {desc(fa, a)} against {desc(fb, b)}"
    if ta != tb:
        for (x, fx, dy) in ((na, fa, b), (nb, fb, a)):
            if fx["register_elems"] > dy["register_tile_budget"]:
                out["registers"] = (f"{op}: {x}'s register tile {_tile(fx['thread_tile'])} holds "
                                    f"{fx['register_elems']} elements, over {dy['name']}'s budget of "
                                    f"{dy['register_tile_budget']}")
                break
    if ba != bb:
        for (x, fx, dx, dy, fy) in ((na, fa, a, b, fb), (nb, fb, b, a, fa)):
            g = tile_grid(fy, fx["block_tile"])
            if g < dy["compute_units"] <= fy["grid"]:
                out["parallelism"] = (f"{op}: {x}'s tile {_tile(fx['block_tile'])} would give {g} blocks for "
                                      f"{dy['name']}'s {dy['compute_units']} {_unit_word(dy)}; {dy['name']} uses "
                                      f"{_tile(fy['block_tile'])} ({fy['grid']} blocks)")
                break
        ra, rb = a["ridge_flop_per_byte"], b["ridge_flop_per_byte"]
        va, vb = math.prod(ba), math.prod(bb)
        if abs(math.log(rb / ra)) > math.log(1.15) and va != vb and (va < vb) == (ra < rb):
            hi, lo = (nb, na) if rb > ra else (na, nb)
            out["balance"] = (f"{op}: {hi} needs more reuse to keep its compute busy ({max(ra, rb):.3g} against "
                              f"{min(ra, rb):.3g} FLOP/byte) and grows a larger block tile: "
                              f"{_tile(bb if hi == nb else ba)} against {_tile(ba if hi == nb else bb)} on {lo}")
    if not out:
        out["ranking"] = (f"{op}: {_tile(ba)} / {_tile(ta)} on {na} ({ea['predicted_ms']:.3g} ms), "
                          f"{_tile(bb)} / {_tile(tb)} on {nb} ({eb['predicted_ms']:.3g} ms)")
    return out


def explain(entries: list[dict[str, Any]], devices: dict[str, dict[str, Any]], baseline: str
            ) -> list[dict[str, Any]]:
    """One section per device other than ``baseline``: what differs in the descriptions, how many ops got
    other tiles, and the reasons with a count and an example each."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for e in entries:
        table.setdefault(e["op"], {})[e["hw"]] = e
    a = devices[baseline]
    sections = []
    for name, b in devices.items():
        if name == baseline:
            continue
        rules = _rules(a, b)
        reasons = {k: Reason(k, TITLES[k], rules[k]) for k in REASONS}
        same = other_block = other_thread = other_bottleneck = 0
        bottleneck_example = ""
        for op, per_hw in table.items():
            ea, eb = per_hw[baseline], per_hw[name]
            fa, fb = ea["facts"], eb["facts"]
            if fa["axes"] != fb["axes"]:
                continue
            if ea["bottleneck"] != eb["bottleneck"]:
                other_bottleneck += 1
                bottleneck_example = bottleneck_example or (
                    f"{op} is bound by {ea['bottleneck']} on {baseline} and by {eb['bottleneck']} on {name}")
            block_differs = fa["block_tile"] != fb["block_tile"]
            thread_differs = fa["thread_tile"] != fb["thread_tile"]
            other_block += block_differs
            other_thread += thread_differs
            if not block_differs and not thread_differs and fa["threads"] == fb["threads"]:
                same += 1
                continue
            for key, example in _reasons_for(op, ea, eb, a, b).items():
                r = reasons[key]
                r.ops.append(op)
                r.example = r.example or example
        n = len(table)
        summary = (f"Of {n} ops, {other_block} get another block tile and {other_thread} another register tile "
                   f"on {name} than on {baseline}; {same} {'keeps' if same == 1 else 'keep'} the same tiles.")
        if other_bottleneck:
            summary += f" The predicted bottleneck differs for {other_bottleneck} ({bottleneck_example})."
        sections.append({
            "device": name, "baseline": baseline,
            "differences": description_differences(a, b),
            "summary": summary,
            "reasons": [r.to_json() for r in sorted(reasons.values(), key=lambda r: -len(r.ops)) if r.ops],
            "counts": {"ops": n, "same": same, "other_block_tile": other_block, "other_register_tile": other_thread,
                       "other_bottleneck": other_bottleneck},
        })
    return sections
