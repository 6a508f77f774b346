"""The report's charts (matplotlib, an optional extra: ``pip install roller[plot]``), as SVG text.

* ``time-per-op``: predicted time of every op on every device (log scale), ops grouped by kind;
* ``ratio-by-kind``: geomean predicted time per op kind relative to the baseline device;
* ``roofline-<device>``: each op placed at its compulsory arithmetic intensity (FLOP per byte of its inputs
  and output, each moved once) and its predicted FLOP/s, under the device's FP32 compute roof and outermost
  memory bandwidth; hollow markers are measured times where there are some.
"""
from __future__ import annotations

import io
import math
from typing import Any

# Device colours and markers: 10 colours x 3 marker shapes keep up to 30 devices apart.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def available() -> str | None:
    """None when matplotlib can be imported, else why not (shown in the report instead of the plots)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        return f"plots need matplotlib ({err}); install it with: pip install 'roller[plot]'"
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "roller-compare", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _style(i: int) -> dict[str, Any]:
    import matplotlib

    # tab20 holds ten dark/light pairs: the ten dark ones first, then the light ones, so up to 20 series
    # get distinct colours (bars have no marker to tell them apart).
    cmap = matplotlib.colormaps["tab20"]
    j = i % 20
    return {"color": cmap(2 * j if j < 10 else 2 * (j - 10) + 1), "marker": _MARKERS[(i // 10 + i) % len(_MARKERS)]}


def slim(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only what the plots read, so that sending entries to a worker process stays cheap."""
    return [{"op": e["op"], "hw": e["hw"], "predicted_ms": e["predicted_ms"],
             "measured": {"measured_ms": e["measured"]["measured_ms"]} if e["measured"] else None}
            for e in entries]


def render(name: str, args: tuple) -> tuple[str, str]:
    """(name, SVG) of one chart: ``name`` is ``time-per-op``, ``ratio-by-kind`` or ``roofline-...``; for a
    process pool."""
    if name == "time-per-op":
        return name, time_per_op(*args)
    if name == "ratio-by-kind":
        return name, ratio_by_kind(*args)
    return name, roofline(*args)


def time_per_op(entries: list[dict[str, Any]], ops: list[dict[str, Any]], devices: list[str]) -> str:
    plt = _pyplot()
    order = sorted(range(len(ops)), key=lambda i: (ops[i]["kind"], i))
    pos = {ops[i]["name"]: x for x, i in enumerate(order)}
    width = max(8.0, min(22.0, 0.11 * len(ops) + 3))
    fig, ax = plt.subplots(figsize=(width, 4.6))
    for d_i, d in enumerate(devices):
        pts = sorted((pos[e["op"]], e["predicted_ms"]) for e in entries if e["hw"] == d and e["predicted_ms"])
        st = _style(d_i)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16, label=d, color=st["color"],
                   marker=st["marker"], alpha=0.85, linewidths=0)
    ax.set_yscale("log")
    ax.set_ylabel("predicted time (ms)")
    ax.set_xlim(-1, len(ops))
    # Kind boundaries and labels instead of one tick per op (hundreds of names do not fit).
    start = 0
    kinds = [ops[i]["kind"] for i in order]
    ticks, labels = [], []
    for x in range(1, len(kinds) + 1):
        if x == len(kinds) or kinds[x] != kinds[start]:
            ticks.append((start + x - 1) / 2)
            labels.append(f"{kinds[start]} ({x - start})")
            if x < len(kinds):
                ax.axvline(x - 0.5, color="#bbb", linewidth=0.6)
            start = x
    ax.set_xticks(ticks, labels, rotation=20 if len(ticks) > 4 else 0, ha="right" if len(ticks) > 4 else "center")
    ax.grid(axis="y", which="major", color="#eee")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, title="device")
    ax.set_title("Predicted time per op (each op's top-1 rProgram)")
    return _svg(fig)


def ratio_by_kind(rows: list[dict[str, Any]], devices: list[str], baseline: str) -> str:
    plt = _pyplot()
    kinds = [r["kind"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(kinds) * max(1, len(devices)) / 4 + 3), 3.8))
    n = len(devices)
    w = 0.8 / max(1, n)
    for d_i, d in enumerate(devices):
        vals = [r["ratio"][d] or math.nan for r in rows]
        ax.bar([k + (d_i - (n - 1) / 2) * w for k in range(len(kinds))], vals, width=w, label=d,
               color=_style(d_i)["color"])
    ax.set_yscale("log")
    ax.axhline(1.0, color="#444", linewidth=0.8)
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel(f"geomean time / {baseline}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, title="device")
    ax.set_title(f"Predicted time relative to {baseline} (below 1: faster)")
    return _svg(fig)


def roofline(device: dict[str, Any], entries: list[dict[str, Any]], ops: dict[str, dict[str, Any]]) -> str:
    """``device``: the device facts (``roller.compare.facts.device_facts``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.9))
    kinds = sorted({ops[e["op"]]["kind"] for e in entries})
    peak = device["fp32_tflops"] * 1e12
    bw = device["global_gbps"] * 1e9
    xs_all, ys_all = [], []
    for k_i, kind in enumerate(kinds):
        pts, meas = [], []
        for e in entries:
            op = ops[e["op"]]
            if op["kind"] != kind or not op["flops"] or not op["bytes"] or not e["predicted_ms"]:
                continue
            x = op["flops"] / op["bytes"]
            pts.append((x, op["flops"] / (e["predicted_ms"] * 1e-3)))
            m = e["measured"]
            if m and m.get("measured_ms"):
                meas.append((x, op["flops"] / (m["measured_ms"] * 1e-3)))
        st = _style(k_i)
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color=st["color"], marker=st["marker"],
                       label=kind, alpha=0.85, linewidths=0)
        if meas:
            ax.scatter([p[0] for p in meas], [p[1] for p in meas], s=22, facecolors="none", edgecolors=st["color"],
                       marker=st["marker"], linewidths=0.9)
        xs_all += [p[0] for p in pts + meas]
        ys_all += [p[1] for p in pts + meas]
    lo = min(xs_all + [device["ridge_flop_per_byte"]]) / 4
    hi = max(xs_all + [device["ridge_flop_per_byte"]]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, bw * x) for x in grid], color="#222", linewidth=1.2)
    ax.annotate(f"FP32 {device['fp32_tflops']:.3g} TFLOP/s", (hi, peak), ha="right", va="bottom", fontsize=7)
    ax.annotate(f"{device['outer_layer']} {device['global_gbps']:.4g} GB/s", (lo, bw * lo), ha="left",
                va="bottom", fontsize=7, rotation=0)
    if device.get("fp32_matrix_tflops"):
        mpk = device["fp32_matrix_tflops"] * 1e12
        ax.plot(grid, [min(mpk, bw * x) for x in grid], color="#888", linewidth=0.8, linestyle="--")
        ax.annotate(f"matrix {device['fp32_matrix_tflops']:.3g} TFLOP/s", (hi, mpk), ha="right", va="bottom",
                    fontsize=7, color="#666")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ymin = min(ys_all + [peak]) / 3
    ax.set_ylim(ymin, max(ys_all + [peak, (device.get("fp32_matrix_tflops") or 0) * 1e12]) * 2.5)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("FLOP per byte (compulsory traffic)")
    ax.set_ylabel("FLOP/s (predicted; hollow: measured)")
    ax.set_title(f"{device['name']} ({device['backend']} {device['target']})")
    ax.grid(which="major", color="#eee")
    if kinds:
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    return _svg(fig)
