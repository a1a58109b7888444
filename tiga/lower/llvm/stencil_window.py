"""lower/llvm: the sliding-window row loop of a stencil sum (schedule.stencil_window).

A stencil row r = (lateral coordinates, x) sums the messages of its sources r + offset.
Group the offsets by their last-axis component dx: G_dx is the list of lateral parts (the
offset's stride sum over the other axes) with that dx. Then

    y[x] = sum over dx of  C_{G_dx}[x + dx],   C_G[c] = sum over g in G of msg(row c + g)

and a column sum C_G[c] serves every row x = c - dx of its line. Along a run of interior
points of one line the kernel keeps the column sums of the window [x + dmin, x + dmax] in
stack buffers (registers once LLVM promotes them), computes only the entering column's
sums per row and slides the window: the 26-point box reads 9 source rows per point (ring
of 8, then the centre on top of it for the full 9) and adds 11 times, where the row walk
reads and adds 26. Nested groups share work: a group that contains an already computed one
starts from a copy of it.

Only where the result is the walk's sum reassociated (schedule.stencil_window): the reducer
is a float or integer sum or mean (reassociable; a mean divides by the row's K edges), the
edge function reads source rows and parameters only (no edge ids, edge or destination
rows), so a message is a function of its source. Every interior point of a lattice takes
this loop wherever a call's row range starts, so a result does not depend on the chunking.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .rules.reductions import identity
from .values import i64
from .walk_base import _strides


@dataclass(frozen=True)
class WindowPlan:
    dmin: int                 # the smallest and largest last-axis offset
    dmax: int
    by_dx: tuple              # per dx in [dmin, dmax]: its group's key (None: no offset)
    sets: tuple               # (key, parent key or None, lateral deltas to add), in order
    edges: int                # K: the pattern's offsets (a mean's divisor)

    @property
    def evals(self) -> int:
        """Messages evaluated per row (the row walk evaluates `edges`)."""
        return sum(len(extra) for _, _, extra in self.sets)

    def needed(self, j: int) -> list:
        """Keys window position j must hold: the groups of every dx it still meets, and
        the groups those start from."""
        keys = {k for k in self.by_dx[:j + 1] if k is not None}
        for key, parent, _ in reversed(self.sets):   # (a group starts from its parent's)
            if key in keys and parent is not None:
                keys.add(parent)
        return [k for k, _, _ in self.sets if k in keys]


def window_plan(shape: tuple, offsets: tuple) -> WindowPlan | None:
    """The window of a stencil pattern, or None where it has no offsets."""
    if not offsets or not shape:
        return None
    strides = _strides(tuple(shape))
    groups: dict = {}
    for off in offsets:
        lateral = sum(o * s for o, s in zip(off[:-1], strides[:-1]))
        groups.setdefault(off[-1], []).append(lateral)
    dmin, dmax = min(groups), max(groups)
    by_dx = tuple(tuple(sorted(groups[dx])) if dx in groups else None
                  for dx in range(dmin, dmax + 1))
    sets, done = [], []
    for key in sorted({k for k in by_dx if k is not None}, key=lambda k: (len(k), k)):
        want = Counter(key)
        parents = [p for p in done if not Counter(p) - want]
        parent = max(parents, key=len) if parents else None
        extra = tuple(sorted((want - Counter(parent or ())).elements()))
        sets.append((key, parent, extra))
        done.append(key)
    return WindowPlan(dmin, dmax, by_dx, tuple(sets), len(offsets))


class WindowEmitter:
    """Emits the window loop of rows [r0, r1) (one line's interior points) for a kernel
    builder `kb` (kernel._KernelBuilder): its reducers, edge function, finish and store."""

    def __init__(self, kb, plan: WindowPlan):
        self.kb, self.plan = kb, plan
        width = plan.dmax - plan.dmin + 1
        # cols[j][key]: the states (one per reducer) of window position j's group `key`
        self.cols = [{key: [red.init(kb.ctx) for red in kb.reds] for key, _, _ in plan.sets}
                     for _ in range(width)]

    def run(self, r0, r1) -> None:
        kb, plan = self.kb, self.plan
        width = len(self.cols)
        for j in range(width - 1):
            self._column(j, kb.b.add(r0, i64(plan.dmin + j), flags=["nsw"]))
        kb.ctx.loop(r0, r1, self._row, name="window")

    def _row(self, r) -> None:
        kb, plan = self.kb, self.plan
        b = kb.b
        last = len(self.cols) - 1
        self._column(last, b.add(r, i64(plan.dmax), flags=["nsw"]))
        states = None
        for j, key in enumerate(plan.by_dx):
            if key is None:
                continue
            if states is None:
                states = [red.init(kb.ctx) for red in kb.reds]
                for s, c in zip(states, self.cols[j][key]):
                    kb.ctx.copy_into(s[0], c[0])
            else:
                for red, s, c in zip(kb.reds, states, self.cols[j][key]):
                    red.merge(kb.ctx, s, c)
        outs = kb._finish(states, i64(plan.edges), kb._row_vals(r))
        kb._store_row(outs, r)
        for j in range(last):
            for key in plan.needed(j):
                for src, dst in zip(self.cols[j + 1][key], self.cols[j][key]):
                    kb.ctx.copy_into(dst[0], src[0])

    def _column(self, j: int, row) -> None:
        """The group sums of window position j, whose column is point `row`."""
        kb = self.kb
        col = self.cols[j]
        for key, parent, extra in self.plan.sets:
            if key not in self.plan.needed(j):
                continue
            for red, state, base in zip(kb.reds, col[key],
                                        col[parent] if parent else [None] * len(kb.reds)):
                if base is None:
                    kb.ctx.fill(state[0], identity(red.kind, red.dtype))
                else:
                    kb.ctx.copy_into(state[0], base[0])
            for delta in extra:
                src = kb.b.add(row, i64(delta), flags=["nsw"]) if delta else row
                msgs = kb.ctx.eval_program(kb.edge_fn, kb._source_args(src))
                k = kb.arity
                for i, (red, state) in enumerate(zip(kb.reds, col[key])):
                    red.fold(kb.ctx, state, msgs[i * k:(i + 1) * k])
