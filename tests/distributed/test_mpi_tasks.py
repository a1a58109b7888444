"""Under mpiexec: a distributed propagate runs a Task-IR plan. The printed module parses and
verifies; its halo transfers, interior and boundary launches and writes follow this rank's
halo plan, recomputed here from the global CSR with plain numpy (the oracle); the runtime
walks those ops (the exchange is started peer by peer in the order of the transfer ops);
results still match one process."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TransferOp, parse_task
from tiga.xla_free_runtime.distributed import exchange

from ._mpi import needs_mpiexec
from .test_mpi_equivalence import _call, _dist, _layer, _problem

pytestmark = [needs_mpiexec, pytest.mark.mpi]


def _expected_halo(g, dg):
    """{peer: ghost rows this rank receives from it}, from the global CSR and ownership."""
    row_ptr, col = (np.asarray(a, np.int64) for a in g.resolve_csr())
    owner = np.empty(g.num_dst, np.int64)
    every = dg.gather(np.full((dg.plan.n_owned, 1), dg.comm.rank, np.int64))[:, 0]
    owner[:] = every
    mine = np.flatnonzero(owner == dg.comm.rank)
    srcs = np.unique(np.concatenate([col[row_ptr[i]:row_ptr[i + 1]] for i in mine]
                                    + [np.zeros(0, np.int64)]))
    foreign = srcs[owner[srcs] != dg.comm.rank]
    boundary = sum(bool(np.isin(col[row_ptr[i]:row_ptr[i + 1]], foreign).any()) for i in mine)
    return {int(q): int((owner[foreign] == q).sum()) for q in np.unique(owner[foreign])}, \
        boundary


def _ops(module, kind):
    return [op for op in module.body.ops if isinstance(op, kind)]


@pytest.mark.parametrize("overlap", [True, False])
def test_plan_is_task_ir_following_the_halo_plan(overlap, monkeypatch):
    monkeypatch.setattr(tg.config, "check", True)      # the plan is verified when built
    g, d = _problem(n=60, seed=21)
    dg = _dist(g, d, "rows")
    dg.overlap = overlap
    layer = _layer("max")
    args = (dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    with tg.profile() as prof:
        y = _call(layer, dg, *args)
    np.testing.assert_allclose(dg.gather(np.asarray(y)),
                               np.asarray(_call(layer, g, d["x"], d["h"], d["w"])),
                               rtol=1e-12, atol=1e-12)
    module = prof.measured("halo")[-1]["module"]
    text = str(module)
    again = parse_task(text)
    again.verify()
    assert str(again) == text
    ghosts, n_boundary = _expected_halo(g, dg)
    halo = [op for op in _ops(module, TransferOp) if op.kind == "halo"]
    assert {op.peer: op.ghosts for op in halo if op.ghosts} == ghosts
    assert sum(op.rows[1] - op.rows[0] for op in halo) == sum(ghosts.values())
    launches = _ops(module, TaskLaunchOp)
    interior = [op for op in launches if op.task_kind == "interior"]
    boundary = [op for op in launches if op.task_kind == "boundary"]
    n_owned = dg.plan.n_owned
    assert sum(b - a for a, b in (op.page_rows for op in launches)) == n_owned
    assert sum(b - a for a, b in (op.page_rows for op in boundary)) == n_boundary
    assert all(op.rank == dg.comm.rank and op.num_ranks == dg.comm.size for op in launches)
    halo_events = {op.event.name for op in halo}
    for op in interior:       # overlapped: no wait; else after the join of every halo
        deps = {e.name for e in op.deps}
        assert deps == set() if overlap else len(op.deps) == 1 and not deps & halo_events
    for op in boundary:
        assert {e.name for e in op.deps} == {op.event.name for op in halo if op.ghosts}
        assert dict(zip(op.halo_ranks, op.halo_ghosts)) == ghosts
    writes = [op for op in _ops(module, TransferOp) if op.kind == "write"]
    assert sorted(op.rows for op in writes) == sorted(op.page_rows for op in launches)
    if launches or halo:
        assert _ops(module, JoinOp) and len(_ops(module, ReleaseOp)) == len(module.body.args)
    assert prof.measured("halo")[-1]["bytes_in"] == sum(ghosts.values()) * 3 * 8   # f64[3]
    # built once: the next call walks the same cached module
    with tg.profile() as again:
        _call(layer, dg, *args)
    assert again.measured("halo")[-1]["module"] is module


def test_runtime_walks_the_transfer_ops(monkeypatch):
    g, d = _problem(n=50, seed=22)
    dg = _dist(g, d, "edges")
    started = []
    original = exchange.HaloExchange.start

    def spy(self, peer):
        started.append(peer)
        return original(self, peer)

    monkeypatch.setattr(exchange.HaloExchange, "start", spy)

    class Two(tg.MessagePassing):      # two source fields, one of them passed twice
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.a * src.b + src.c

    x, z = dg.local(d["x"]), dg.local(d["h"])
    # traced: "a" and "c" are one operand of the equation, exchanged once
    with tg.profile() as prof:
        y = tg.jit(lambda x, z: Two()(graph=dg, src={"a": x, "b": z, "c": x}))(x, z)
    want = Two()(graph=g, src={"a": d["x"], "b": d["h"], "c": d["x"]})
    np.testing.assert_allclose(dg.gather(np.asarray(y)), np.asarray(want), rtol=1e-12)
    halo = [op for op in _ops(prof.measured("halo")[-1]["module"], TransferOp)
            if op.kind == "halo"]
    assert len({op.value.name for op in halo}) == (2 if dg.plan.peers() else 0)
    assert started == [op.peer for op in halo]


def test_source_grouped_plan_sends_ghost_cotangents_home():
    g, d = _problem(seed=23)
    dg = _dist(g, d, "rows")
    layer = _layer("sum")
    wl = dg.local_edges(d["w"])
    with tg.profile() as prof:      # (the plans that ran, as their run reports name them)
        got = tg.grad(lambda x: (_call(layer, dg, x, x, wl) ** 2).sum())(dg.local(d["x"]))
    want = tg.grad(lambda x: (_call(layer, g, x, x, d["w"]) ** 2).sum())(d["x"])
    np.testing.assert_allclose(dg.gather(np.asarray(got)), want, rtol=1e-9, atol=1e-12)
    by_src = [r["module"] for r in prof.measured("halo")
              if any(op.kind == "accumulate" for op in _ops(r["module"], TransferOp))]
    assert by_src, "no source-grouped plan ran"
    for module in by_src:
        parse_task(str(module)).verify()
        launch = _ops(module, TaskLaunchOp)[0]
        results = {v.name for v in launch.results[:-1]}
        back = [op for op in _ops(module, TransferOp)
                if op.kind == "halo" and op.value.name in results]
        assert sorted(op.peer for op in back) == sorted(dg.plan.peers() * len(results))
        assert {op.peer: op.ghosts for op in back if op.ghosts} == \
            {q: b - a for q, a, b in dg.plan.recv}


@pytest.mark.parametrize("reducer", ["sum", "max"])
def test_every_halo_launch_runs_through_the_backend_table_and_is_printed(reducer):
    """Issue 37: a recording backend in place of cpu-llvm sees every kernel this rank's halo
    plan launches (interior and boundary), and each is a kernel of the Task IR ir("task")
    prints for the call."""
    from tiga.testing import printed_kernels, recording

    g, d = _problem(n=60, seed=5)
    dg = _dist(g, d, "rows")
    layer = _layer(reducer)
    args = (dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    with recording() as rec:
        y = _call(layer, dg, *args)
    np.testing.assert_allclose(dg.gather(np.asarray(y)),
                               np.asarray(_call(layer, g, d["x"], d["h"], d["w"])),
                               rtol=1e-12, atol=1e-12)
    text = layer.ir("task", graph=dg, src={"x": args[0]}, dst={"h": args[1]},
                    edge={"w": args[2]}, scale=1.5)
    assert '"gf_task.launch"' in text and 'kind = "halo"' in text
    assert rec.launched, "no kernel was launched through the backend table"
    assert rec.names() <= printed_kernels(text), sorted(rec.names() - printed_kernels(text))


def test_a_distributed_call_lowers_once(monkeypatch):
    """Issue 37: the halo plans of every propagate over a DistributedGraph unroll one-page
    modules from one lowering of the call signature; a warm call lowers nothing."""
    import threading

    from tiga.lower import pipeline

    calls, depth = [], threading.local()

    def wrap(name, fn):
        def counted(*a, **k):
            if getattr(depth, "n", 0) == 0:
                calls.append(name)
            depth.n = getattr(depth, "n", 0) + 1
            try:
                return fn(*a, **k)
            finally:
                depth.n -= 1
        return counted

    for name, fn in list(vars(pipeline).items()):
        if (callable(fn) and getattr(fn, "__module__", None) == pipeline.__name__
                and not isinstance(fn, type) and name not in ("quiet_dumps", "module_name")):
            monkeypatch.setattr(pipeline, name, wrap(name, fn))
    g, d = _problem(n=50, seed=8)
    dg = _dist(g, d, "rows")
    first, second = _layer("sum"), _layer("max")

    def two(x, h, w):
        y = _call(first, dg, x, h, w)
        return _call(second, dg, y, h, w)

    args = (dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    step = tg.jit(two)
    y = step(*args)
    assert calls == ["lower_call"], calls
    calls.clear()
    np.testing.assert_allclose(np.asarray(step(*args)), np.asarray(y), rtol=1e-12)
    assert calls == [], calls
    want = _call(second, g, _call(first, g, d["x"], d["h"], d["w"]), d["h"], d["w"])
    np.testing.assert_allclose(dg.gather(np.asarray(y)), np.asarray(want), rtol=1e-10,
                               atol=1e-10)
