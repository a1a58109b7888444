"""explain() of a paged call agrees with its Task IR (issue 26 item 5): the page count, the
kernel schedule and the task counts explain() prints are those of the page plan that
`layer.ir("task", **call)` prints (parsed back with parse_task), and that plan is the one
the run walks (PageStats.module of a profiled call)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tiga as tg
from tiga.lower.ir.kernel import LaunchOp
from tiga.lower.ir.task import TaskLaunchOp, TransferOp, parse_task
from tiga.xla_free_runtime.reports.explain import schedule_line

pytest.importorskip("zarr", minversion="3.1")

N = 5000


class Twice(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * 2.0 + dst.b


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "s"
    ci = np.random.default_rng(0).integers(0, N, 2 * N)
    with tg.store.create(path, num_src=N, num_dst=N, overwrite=True) as w:
        w.append_csr_chunk(np.arange(N + 1) * 2, ci)
        w.append_field("x", np.arange(2.0 * N).reshape(N, 2), role="src")
    return tg.Graph.open(path), tg.store.open(path), ci


@pytest.mark.parametrize("page_rows,budget,x_on", [(700, None, "disk"), (2048, None, "host"),
                                                   (512, "64KiB", "disk")])
def test_paged_explain_counts_the_plan_ir_task_prints(stored, page_rows, budget, x_on):
    g, store, ci = stored
    x = store["x"] if x_on == "disk" else np.arange(2.0 * N).reshape(N, 2)
    call = dict(graph=g, src={"x": x}, dst={"b": np.ones((N, 1))})
    layer = Twice()
    with tg.scope(page_rows=page_rows, budgets={"host": budget} if budget else None):
        text = layer.ir("task", **call)
        ex = layer.explain(**call)
        with tg.profile() as prof:
            y = layer(**call)
    module = parse_task(text)
    pages = [op for op in module.body.ops if isinstance(op, TaskLaunchOp)]
    n = -(-N // page_rows)
    assert len(pages) == n and {op.num_pages for op in pages} == {n}
    # the routes line and the tasks line count the plan's pages
    (route,) = [why for r, _, why in ex.routes if r == "paged"]
    assert route.startswith(f"{n} page(s) of {page_rows} destination rows")
    assert f"{n} gf_task.launch of task_kind page (pages 0 to {n - 1} of {n})" in ex.tasks
    moves = {}
    for op in module.body.ops:
        if isinstance(op, TransferOp):
            key = f"{op.kind} {op.src_tier} -> {op.dst_tier}"
            moves[key] = moves.get(key, 0) + 1
    for key, count in moves.items():
        assert f"{count} {key}" in ex.tasks
    assert ("write host -> disk" in moves) == (budget is not None)      # result tier
    assert ("gather disk -> host" in moves) == (x_on == "disk")         # field tier
    # the schedule is the page kernel's, as the IR prints it
    kernel = next(op for op in pages[0].body.ops if isinstance(op, LaunchOp))
    assert ex.schedule.startswith(schedule_line(kernel) + "; once per page")
    assert kernel.schedule.target == "cpu-llvm" and ex.route == "cpu-llvm"
    assert not re.search(r"none \(interpreted\)|page 0 of 1\b", str(ex))
    # and the run walked that plan
    (stats,) = prof.measured("paged")
    assert stats.pages == n and str(stats.module) == text
    want = 2.0 * np.arange(2.0 * N).reshape(N, 2)[ci].reshape(N, 2, 2).sum(1) + 2.0
    np.testing.assert_allclose(np.asarray(y), want)
