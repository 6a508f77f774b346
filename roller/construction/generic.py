"""Shape-generic kernels: one small set of rPrograms that serves every value of an op's symbolic size.

A kernel is built for the symbol's greatest value and launched, for a smaller one, on the blocks that cover
it. That is exact when the symbol's axis leads the prepared op's axes (its block index is the outermost one a
kernel decodes, so fewer blocks are a prefix of the grid), is not reduced, and leads every tensor it indexes
as a plain index: then the rows of a smaller size are a prefix of every such tensor, and the points past it
that the last block computes read and write rows that the caller's buffers hold but nobody reads.

Which tiles to keep (DietCode's question, answered by construction instead of search): construction runs at
sample sizes across the range, the model predicts every candidate at sample sizes across it (at the rows
its last block covers), and a greedy set cover keeps few programs such that every sample has one within
``COVER_SLACK`` of the best candidate there, among those that compute at most ``WASTE_CAP`` times its rows. At a
call, the model picks among them for the exact size, with no compilation.

Where the device is at hand (``timer``), the model shortlists and the device decides, as Roller times its top-K
for one size: the candidates the model ranks near the best at each sample are timed there, the cover is made
over the measured times, and at a call each kept program's prediction is scaled by its measured / predicted
ratio at the nearest samples where it ran (the model's error is the same at neighbouring sizes; its ranking of
thin tiles is not what PoCL runs: BERT's projections at 7 rows took a 2-row tile at 3x the 4-row one's time).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from roller.construction import construct, predict_program, prepared, row_proxy, symbol_args
from roller.construction.matrix import MatrixSupport
from roller.construction.symbol_args import RuntimeAxes, TwoSizes, at_extents, runtime_axes, two_sizes
from roller.hw import HardwareDesc
from roller.ir.expr import Affine
from roller.ir.symbolic import SymbolicOp
from roller.ir.tensor_expr import Axis, TensorDecl, TensorExpr
from roller.program import RProgram, launch_counts

# Seconds of each (program index, sample size) asked, on this machine's device, for the programs of the
# KernelSet it is given (roller.compiler.kernel_set renders, compiles and runs them: the core imports no backend).
Timer = Callable[["KernelSet", list[tuple[int, int]]], dict[tuple[int, int], float]]

# A kept set is done when every sample size has a program predicted within this factor of the best candidate.
# Tight: block shapes the model predicts within a few percent of each other ran 1.6-2x apart on PoCL (a BERT
# projection's 16x256 blocks against the 64x48 of the kernel built for each length), and a slack of 5% let one
# program serve every size.
COVER_SLACK = 1.01
# ... among the programs that compute at most this many times the rows a size has. The model ranks a 4-row tile
# at 1 row like a 1-row tile (both read the whole weight once), while PoCL runs it 2x slower: on this CPU a
# matmul that thin is compute-bound in the thread's inner loop. Bounding the waste keeps that out of the set
# (at 1.5, an 8-row tile served 17 rows of BERT's FFN matmul at 2.9x the exact kernel's time; at 1.25, 6-row).
WASTE_CAP = 1.25
# Along each axis of a kernel that takes the size as an argument. The cap above left attention's scores at 17
# with a 3x3 tile (3.7x the time of the kernel built for 17, whose 18x32 tile computes 32 columns of 17).
RUNTIME_WASTE_CAP = 2.0
MAX_KERNELS = 6
# Timed at each sample when a timer is given: the model's best few there, within this factor of its best.
SHORTLIST = 4
SHORTLIST_SLACK = 2.0
# A measured time serves a sample within this factor of the fastest measured there (the device's noise: a
# tighter bound keeps a kernel per sample for differences that move between runs).
MEASURED_SLACK = 1.05
# Programs taken from construction at each representative size.
PER_SIZE = 3


@dataclass(frozen=True)
class GenericAxis:
    """How the symbol shows in the prepared op: its leading axis has extent ``value * per_value`` (an axis fused
    with inner ones counts their product), and ``tensors`` are the tensors whose leading dimension is that axis."""

    symbol: str
    axis: str
    per_value: int
    tensors: tuple[str, ...]


def generic_axis(op: SymbolicOp, hw: HardwareDesc, at: TwoSizes | None = None) -> GenericAxis | str:
    """The symbol's axis where one kernel built for the greatest size serves every size, else why not (``at``:
    the op at two sizes, when the caller has prepared them already)."""
    sizes = at or two_sizes(op, hw, "a shape-generic kernel serves")
    if isinstance(sizes, str):
        return sizes
    at = sizes
    sym, hi, other, top, low = at.symbol, at.hi, at.other, at.top, at.low
    if len(top.axes) != len(low.axes) or not top.axes or top.axes[0].reduce:
        return f"{sym} does not lead the op's axes as a spatial axis"
    lead = top.axes[0]
    q, rem = divmod(lead.extent, hi)
    if rem or q * other != low.axes[0].extent or lead.name != low.axes[0].name:
        return f"{sym} does not lead the op's axes (the leading axis does not scale with it)"
    for a, b in zip(top.axes[1:], low.axes[1:]):
        if a != b:
            return f"axis {a.name} changes with {sym}"
    if top.preparation != low.preparation:
        return f"{sym} changes how the op is prepared"
    scaled = []
    for t, u in zip(top.tensors, low.tensors):
        if t == u:
            if any(lead.name in idx[d].coefs for idx in _indices(top, t.name) for d in range(len(idx))):
                return f"tensor {t.name} is read along {sym} but does not grow with it"
            continue
        if t.view is not None or (t.name, t.dtype) != (u.name, u.dtype) or t.shape[1:] != u.shape[1:] or \
                (t.shape[0], u.shape[0]) != (hi * q, other * q):
            return f"tensor {t.name} grows with {sym} other than in its leading dimension"
        if not _leads(t.orig_shape, u.orig_shape, hi, other):
            return f"tensor {t.name} grows with {sym} other than in its leading dimension"
        if any(idx[0] != Affine.axis(lead.name) or any(lead.name in i.coefs for i in idx[1:])
               for idx in _indices(top, t.name)):
            return f"tensor {t.name} is not indexed by {sym} alone in its leading dimension"
        scaled.append(t.name)
    same = ("name", "kind", "out_index", "reduce_op", "body", "pad_value", "acc_dtype", "epilogue", "stages")
    if any(getattr(top, f) != getattr(low, f) for f in same):
        return f"the op's statement changes with {sym}"
    return GenericAxis(sym, lead.name, q, tuple(scaled))


def _leads(top: tuple[int, ...] | None, low: tuple[int, ...] | None, hi: int, other: int) -> bool:
    """True when a tensor as written (before axis fusion) grows in one dimension, after unit ones only: its
    rows are then a prefix of its memory at every size."""
    if top is None or low is None:
        return top is None and low is None
    changed = [i for i, (a, b) in enumerate(zip(top, low)) if a != b]
    if len(top) != len(low) or len(changed) != 1:
        return False
    k = changed[0]
    return all(d == 1 for d in top[:k]) and top[k] % hi == 0 and top[k] // hi * other == low[k]


def _indices(expr: TensorExpr, name: str) -> list[tuple[Affine, ...]]:
    if name == expr.output.name:
        return [expr.out_index]
    return expr.accesses(name)


def at_size(top: TensorExpr, ax: GenericAxis, value: int, source: TensorExpr) -> TensorExpr:
    """The prepared op ``top`` (built at the greatest size) with the symbol at ``value``: the same form, not
    prepared anew, so every kernel of the set has the same axes at every size."""
    ext = value * ax.per_value

    def grow(t: TensorDecl) -> TensorDecl:
        if t.name not in ax.tensors:
            return t
        orig = t.orig_shape
        if orig is not None:
            # As written, the tensor leads with unit dimensions and then the symbol's (checked by generic_axis).
            k = next(i for i, d in enumerate(orig) if d != 1)
            hi = t.shape[0] // ax.per_value
            orig = orig[:k] + (value * (orig[k] // hi),) + orig[k + 1:]
        return dataclasses.replace(t, shape=(ext,) + t.shape[1:], orig_shape=orig)

    axes = (Axis(top.axes[0].name, ext, False),) + top.axes[1:]
    return dataclasses.replace(top, axes=axes, output=grow(top.output), inputs=tuple(grow(t) for t in top.inputs),
                               source=source)


def retarget(prog: RProgram, expr: TensorExpr) -> RProgram:
    """``prog``'s tiles over ``expr`` (the same form at another size), with its grid for that size (a row
    kernel's blocks tile its rows only)."""
    grid, _ = launch_counts(row_proxy(expr) if expr.stages else expr, prog.block_tile, prog.thread_tile,
                            prog.reduce_threads)
    return dataclasses.replace(prog, expr=expr, grid=grid, prediction=None)


def sample_sizes(lo: int, hi: int, past: bool = False) -> tuple[int, ...]:
    """Sizes the kept set must serve well: both ends, every power of two between them and the midpoints
    (x1.5) between those, so neighbouring samples are at most 1.5x apart; with ``past``, each of those plus one
    too (where a tile made for the size below wastes most: 17 rows under a 16-row tile cost 32)."""
    out = {lo, hi}
    p = 1
    while p <= hi:
        for v in (p, p * 3 // 2):
            if lo <= v <= hi:
                out.add(v)
        p *= 2
    if past:
        out |= {v + 1 for v in out if v < hi}
    return tuple(sorted(out))


def representative_sizes(lo: int, hi: int, past: bool = False) -> tuple[int, ...]:
    """Sizes construction runs at: the sample sizes (construction takes milliseconds per size, and a tile
    made for a size is what the sizes just below it want)."""
    return sample_sizes(lo, hi, past)


def covered(prog: RProgram, ax: GenericAxis, value: int, greatest: int) -> int:
    """The symbol's size a program computes at ``value``: its last block's rows past ``value`` are computed
    too (and thrown away), so that is the size it costs."""
    b = prog.block_tile.shape[0]
    rows = -(-value * ax.per_value // b) * b
    return min(-(-rows // ax.per_value), greatest)


def form_at(top: TensorExpr, ax: GenericAxis | RuntimeAxes, value: int, source: TensorExpr) -> TensorExpr:
    """The prepared op ``top`` (at the greatest size) at size ``value`` (``source``: the op as written there)."""
    if isinstance(ax, RuntimeAxes):
        return at_extents(top, ax, {a: value for a in ax.axes}, source)
    return at_size(top, ax, value, source)


def _cost_form(prog: RProgram, ax: GenericAxis | RuntimeAxes, value: int, greatest: int,
               form: Callable[[int], TensorExpr], source: Callable[[int], TensorExpr]) -> TensorExpr:
    """The op a kept program computes at ``value`` (its last blocks' points past it included): what the model
    predicts."""
    if isinstance(ax, RuntimeAxes):
        return at_extents(prog.expr, ax, symbol_args.covered(prog, ax, value), source(value))
    return form(covered(prog, ax, value, greatest))


def _fits(prog: RProgram, ax: GenericAxis | RuntimeAxes, value: int, greatest: int) -> bool:
    """Whether a program computes at most WASTE_CAP times the points ``value`` has."""
    if isinstance(ax, RuntimeAxes):
        # Along each axis: with two axes of the symbol (attention's scores), a cap on their product left only
        # tiles of a few points for most sizes (3x3 blocks of 9 threads on an H100 from 17 to 141).
        return all(extent <= value * RUNTIME_WASTE_CAP for extent in symbol_args.covered(prog, ax, value).values())
    return covered(prog, ax, value, greatest) <= value * WASTE_CAP


@dataclass
class KernelSet:
    """The kept programs (each over the op at the greatest size: what is rendered) and how to choose. ``axis``
    says how a kernel serves a smaller size: launched on a prefix of its grid (``GenericAxis``), or given the
    size as an argument (``RuntimeAxes``, roller.construction.symbol_args)."""

    op: SymbolicOp
    hw: HardwareDesc
    axis: GenericAxis | RuntimeAxes
    programs: list[RProgram]
    samples: tuple[int, ...]
    # predicted seconds of each kept program at each sample size (rows: programs)
    predicted: list[list[float]]
    candidates: int  # programs construction offered across the representative sizes
    # measured seconds of each kept program at each sample size, where it was timed (else inf): a set chosen
    # on the device; None: chosen by the model alone
    measured: list[list[float]] | None = None
    # (from, to, kept program) covering the symbol's range: the choices of a set read back from dispatch.json,
    # which has no predictions to choose by (empty: choose by them)
    dispatch: tuple[tuple[int, int, int], ...] = ()
    _forms: dict[int, TensorExpr] = field(default_factory=dict, repr=False)
    _choice: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def greatest(self) -> int:
        return self.op.ranges[self.axis.symbol][1]

    @property
    def scalar_args(self) -> bool:
        """Whether the kernels take the symbol's value as an argument (runtime extents)."""
        return isinstance(self.axis, RuntimeAxes)

    def scalars(self, value: int) -> tuple[int, ...]:
        """The kernels' int arguments at ``value``."""
        return (value,) if self.scalar_args else ()

    def source(self, value: int) -> TensorExpr:
        return self.op.instantiate({**{s: r[1] for s, r in self.op.ranges.items()}, self.axis.symbol: value})

    def form(self, value: int) -> TensorExpr:
        if value not in self._forms:
            self._forms[value] = form_at(self.programs[0].expr, self.axis, value, self.source(value))
        return self._forms[value]

    def predict(self, index: int, value: int) -> float:
        """Predicted seconds of kept program ``index`` at size ``value`` (the points its blocks cover)."""
        prog = self.programs[index]
        expr = _cost_form(prog, self.axis, value, self.greatest, self.form, self.source)
        pred = predict_program(retarget(prog, expr), self.hw)
        return pred.time_s if pred is not None else math.inf

    def expected(self, index: int, value: int) -> float:
        """Seconds expected of kept program ``index`` at ``value``: the model's prediction, scaled by the
        program's measured / predicted ratio at the nearest timed samples (geometrically between the two
        around ``value``) where the set was chosen on the device."""
        pred = self.predict(index, value)
        if self.measured is None or not math.isfinite(pred):
            return pred
        timed = [(v, m / p) for v, m, p in zip(self.samples, self.measured[index], self.predicted[index])
                 if math.isfinite(m) and math.isfinite(p) and p > 0]
        if not timed:
            return pred
        below = [t for t in timed if t[0] <= value]
        above = [t for t in timed if t[0] >= value]
        if not below or not above:
            return pred * (below[-1] if below else above[0])[1]
        (v0, r0), (v1, r1) = below[-1], above[0]
        if v0 == v1:
            return pred * r0
        w = math.log(value / v0) / math.log(v1 / v0)
        return pred * math.exp((1 - w) * math.log(r0) + w * math.log(r1))

    def choose(self, value: int) -> int:
        """The kept program expected fastest at ``value`` among those within the waste cap (memoised: a
        repeated size costs a lookup)."""
        if value not in self._choice:
            self.op.check_values({**{s: r[1] for s, r in self.op.ranges.items()}, self.axis.symbol: value})
            if self.dispatch:
                self._choice[value] = next(k for lo, hi, k in self.dispatch if lo <= value <= hi)
                return self._choice[value]
            # Where none fits (the set is full): the least waste by the model, or every kept program where the
            # set was timed (each was timed at the samples none fits, so the device decides there too).
            fit = [i for i, p in enumerate(self.programs) if _fits(p, self.axis, value, self.greatest)] or \
                (list(range(len(self.programs))) if self.measured is not None else
                 [min(range(len(self.programs)), key=lambda i: (self._waste(i, value), i))])
            self._choice[value] = min(fit, key=lambda i: (self.expected(i, value), i))
        return self._choice[value]

    def _waste(self, index: int, value: int) -> float:
        prog = self.programs[index]
        if isinstance(self.axis, RuntimeAxes):
            return symbol_args.waste(prog, self.axis, value)
        return covered(prog, self.axis, value, self.greatest) / value

    def blocks(self, index: int, value: int) -> int:
        """Blocks to launch for ``value``: those covering its rows, times the other axes' blocks."""
        prog = self.programs[index]
        if isinstance(self.axis, RuntimeAxes):
            return symbol_args.blocks(prog, self.axis, value)
        lead = -(-prog.expr.axes[0].extent // prog.block_tile.shape[0])
        return prog.grid // lead * -(-value * self.axis.per_value // prog.block_tile.shape[0])

    def rows(self, index: int, value: int) -> int:
        """Leading rows every growing tensor's buffer must hold at ``value``: the last launched block's points
        past ``value`` read and write rows up to there."""
        if isinstance(self.axis, RuntimeAxes):
            return symbol_args.rows(self.programs[index], self.axis, value)
        return covered(self.programs[index], self.axis, value, self.greatest)

    def intervals(self, every_up_to: int = 4096) -> list[dict[str, int]]:
        """The whole dispatch as intervals of sizes, ``[{"from": a, "to": b, "kernel": i}, ...]``, for a
        launcher that has no model: every size up to ``every_up_to`` is decided, beyond it the sample sizes
        (each deciding up to the next)."""
        lo, hi = self.op.ranges[self.axis.symbol]
        sizes = [v for v in range(lo, min(hi, every_up_to) + 1)] + [v for v in self.samples if v > every_up_to]
        out: list[dict[str, int]] = []
        for v in sizes:
            i = self.choose(v)
            if out and out[-1]["kernel"] == i:
                out[-1]["to"] = v
            else:
                if out:
                    out[-1]["to"] = v - 1
                out.append({"from": v, "to": v, "kernel": i})
        out[-1]["to"] = hi
        return out

    def table(self) -> list[dict[str, object]]:
        """The dispatch table over the sample sizes: which program each size takes and its prediction."""
        rows: list[dict[str, object]] = []
        for j, v in enumerate(self.samples):
            i = self.choose(v)
            row: dict[str, object] = {"size": v, "kernel": i, "predicted_ms": self.predict(i, v) * 1e3}
            if self.measured is not None and math.isfinite(self.measured[i][j]):
                row["measured_ms"] = self.measured[i][j] * 1e3
            rows.append(row)
        return rows


def set_axis(op: SymbolicOp, hw: HardwareDesc) -> tuple[GenericAxis | RuntimeAxes | str, TwoSizes | None]:
    """How a kernel set of ``op`` serves its sizes (launched on a prefix of its grid, or given the size as an
    argument), or why neither serves; with the op prepared at two sizes, which both tests look at."""
    sizes = two_sizes(op, hw, "a shape-generic kernel serves")
    at = sizes if isinstance(sizes, TwoSizes) else None
    leading = generic_axis(op, hw, at)
    if not isinstance(leading, str):
        return leading, at
    ax = runtime_axes(op, hw, at)
    return (f"{leading}; with the size as a kernel argument: {ax}" if isinstance(ax, str) else ax), at


def construct_generic(op: SymbolicOp, hw: HardwareDesc, matrix: Iterable[MatrixSupport] = (),
                      max_kernels: int = MAX_KERNELS, timer: Timer | None = None) -> KernelSet | str:
    """The kept programs of ``op``'s shape-generic kernel set on ``hw``, or why one kernel cannot serve every
    size (the caller then builds per size). With ``timer``, the set is chosen on the device (module doc)."""
    ax, at = set_axis(op, hw)
    if isinstance(ax, str):
        return ax
    lo, hi = op.ranges[ax.symbol]
    base = {s: r[1] for s, r in op.ranges.items()}
    top = at.top if at is not None else prepared(op.instantiate(base), hw, align=False)
    forms: dict[int, TensorExpr] = {hi: top}
    sources: dict[int, TensorExpr] = {}

    def source(v: int) -> TensorExpr:
        if v not in sources:
            sources[v] = op.instantiate({**base, ax.symbol: v})
        return sources[v]

    def form(v: int) -> TensorExpr:
        if v not in forms:
            forms[v] = form_at(top, ax, v, source(v))
        return forms[v]

    extra = ax.runtime if isinstance(ax, RuntimeAxes) else ()
    pool: dict[tuple, RProgram] = {}
    made_at: dict[tuple, set[int]] = {}  # the sizes construction offered each candidate at
    # Sizes just past each sample are sampled where the device decides: their best tiles (an 18-row one for
    # 17 rows) are what the model's set misses most, and timing is what can tell them apart. Not for kernels
    # that take the size as an argument: their tiles may cover twice a size (RUNTIME_WASTE_CAP), and the
    # extra samples spread the 6 kernels thinner (BERT's softmax: 1.28x -> 1.57x the exact kernels).
    past = timer is not None and isinstance(ax, GenericAxis)
    for v in representative_sizes(lo, hi, past):
        # Matrix-instruction and split-reduction programs decode their blocks differently, and vector programs
        # bake their extent into the grid-stride loop: not offered here.
        progs = [p for p in construct(form(v), hw, top_k=PER_SIZE * 2, matrix=matrix)
                 if not p.use_matrix and p.reduce_threads == 1 and p.vector == 1][:PER_SIZE]
        for p in progs:
            pool.setdefault(p.key(), dataclasses.replace(retarget(p, top), runtime=extra))
            made_at.setdefault(p.key(), set()).add(v)
    cands = list(pool.values())
    samples = sample_sizes(lo, hi, past)
    times = []
    for c in cands:
        row = []
        for v in samples:
            pred = predict_program(retarget(c, _cost_form(c, ax, v, hi, form, source)), hw)
            row.append(pred.time_s if pred is not None else math.inf)
        times.append(row)
    # A program may serve a sample only where it computes at most WASTE_CAP times its points.
    fits = [[_fits(c, ax, v, hi) for v in samples] for c in cands]
    measured: list[list[float]] | None = None
    if timer is None:
        kept = _count_cover(times, fits, COVER_SLACK, max_kernels)
    else:
        # Timed at a sample: the model's best there, and what construction offered for that very size (the model
        # ranks a kernel that takes the size as an argument other than the one built for it: BERT's softmax at
        # 384 took a scalar row kernel at 1.8x the time of the whole-row one construction built for 384).
        made = [made_at[k] for k in pool]  # in the order of cands
        mine = [[v in made[i] and fits[i][j] for j, v in enumerate(samples)] for i in range(len(cands))]
        near = [[mine[i][j] or _near(times, fits, i, j) for j in range(len(samples))] for i in range(len(cands))]
        short = [i for i in range(len(cands)) if any(near[i])]
        trial = KernelSet(op, hw, ax, [cands[i] for i in short], samples, [times[i] for i in short], len(cands))
        trial._forms.update(forms)
        asked = [(k, samples[j]) for k, i in enumerate(short) for j in range(len(samples)) if near[i][j]]
        got = timer(trial, asked)
        table = [[got.get((k, v), math.inf) for v in samples] for k in range(len(short))]
        picked = _cover(table, [[math.isfinite(t) for t in row] for row in table], MEASURED_SLACK, max_kernels)
        kept = [short[k] for k in picked]
        measured = [table[k] for k in picked]
        if not kept:  # nothing ran: the model's set, as without a device
            kept, measured = _count_cover(times, fits, COVER_SLACK, max_kernels), None
        else:
            # Every kept program at every sample it may serve, so that each size's choice is calibrated at the
            # samples on both sides of it (a program timed only far away carried that error to other sizes), and
            # at the samples none of them may serve (the set full before it reached them), which take the
            # fastest there.
            final = KernelSet(op, hw, ax, [cands[i] for i in kept], samples, [times[i] for i in kept], len(cands))
            final._forms.update(forms)
            unserved = {j for j in range(len(samples)) if not any(fits[i][j] for i in kept)}
            more = timer(final, [(k, samples[j]) for k, i in enumerate(kept) for j in range(len(samples))
                                 if (fits[i][j] or j in unserved) and not math.isfinite(measured[k][j])])
            measured = [[more.get((k, v), t) for v, t in zip(samples, row)] for k, row in enumerate(measured)]
    programs = [dataclasses.replace(cands[i], prediction=predict_program(cands[i], hw)) for i in kept]
    ks = KernelSet(op, hw, ax, programs, samples, [times[i] for i in kept], len(cands), measured)
    ks._forms.update(forms)
    return ks


def _near(times: list[list[float]], fits: list[list[bool]], i: int, j: int) -> bool:
    """Whether candidate ``i`` is among the model's SHORTLIST best at sample ``j`` (within SHORTLIST_SLACK)."""
    if not fits[i][j] or not math.isfinite(times[i][j]):
        return False
    ranked = sorted(times[k][j] for k in range(len(times)) if fits[k][j])
    return times[i][j] <= min(ranked[0] * SHORTLIST_SLACK, ranked[min(SHORTLIST, len(ranked)) - 1])


def _count_cover(table: list[list[float]], fits: list[list[bool]], slack: float, max_kernels: int) -> list[int]:
    """Rows of ``table`` (predicted seconds of each candidate at each sample) to keep: greedily the candidate
    serving most of the samples not yet served (within ``slack`` of the best fitting candidate there; ties: the
    least total over them relative to the best), until every sample is served or ``max_kernels`` are kept.
    With the model's times this keeps what construction built for each size, which the model ranks within 1%
    of its best there; ``_cover``, the budgeted choice, took broader programs the model rates near the best at
    many sizes and ran 1.39x the exact kernels against this one's 1.28x (BERT's operators, 48 sizes)."""
    n = len(table[0]) if table else 0
    best = [min((table[i][j] for i in range(len(table)) if fits[i][j]), default=math.inf) for j in range(n)]

    def serves(i: int, j: int) -> bool:
        return fits[i][j] and table[i][j] <= best[j] * slack

    def gain(i: int, unserved: set[int]) -> tuple[int, float]:
        served = [j for j in unserved if serves(i, j)]
        return len(served), -sum(table[i][j] / best[j] for j in served)

    kept: list[int] = []
    open_ = {j for j in range(n) if best[j] < math.inf}
    while open_ and len(kept) < max_kernels:
        pick = max((i for i in range(len(table)) if i not in kept), key=lambda i: (*gain(i, open_), -i),
                   default=None)
        if pick is None or gain(pick, open_)[0] == 0:
            break
        kept.append(pick)
        open_ = {j for j in open_ if not serves(pick, j)}
    return kept


def _cover(table: list[list[float]], fits: list[list[bool]], slack: float, max_kernels: int) -> list[int]:
    """Rows of ``table`` (measured seconds of each candidate at each sample) to keep: greedily the candidate
    that most lowers the sum over samples of log(time of the best kept one that fits / best fitting time
    there), until every sample has a kept candidate within ``slack`` of its best or ``max_kernels`` are kept.
    (``_count_cover`` on measured times spent the budget on a kernel per small size, timed within a few percent
    of each other, and left the sizes between with none.)"""
    n = len(table[0]) if table else 0
    best = [min((table[i][j] for i in range(len(table)) if fits[i][j]), default=math.inf) for j in range(n)]
    live = [j for j in range(n) if math.isfinite(best[j])]
    # A sample no kept candidate serves costs more than any candidate could (so that covering it comes first).
    miss = 1.0 + max((math.log(table[i][j] / best[j]) for i in range(len(table)) for j in live
                      if fits[i][j] and math.isfinite(table[i][j])), default=0.0)

    def excess(i: int, j: int) -> float:
        return math.log(table[i][j] / best[j]) if fits[i][j] and math.isfinite(table[i][j]) else miss

    now = {j: miss for j in live}
    kept: list[int] = []
    def total(i: int, now: dict[int, float]) -> float:
        return sum(min(now[j], excess(i, j)) for j in live)

    while len(kept) < max_kernels and any(e > math.log(slack) for e in now.values()):
        pick = min((i for i in range(len(table)) if i not in kept), key=lambda i: (total(i, now), i), default=None)
        if pick is None or total(pick, now) >= sum(now.values()):
            break
        kept.append(pick)
        now = {j: min(now[j], excess(pick, j)) for j in live}
    return kept
