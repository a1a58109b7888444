"""Under mpiexec (2, 3 or 4 ranks): a program over a DistributedGraph gives what the same
program gives over the global graph in one process (the oracle), forward and backward.
Data comes from fixed seeds so every rank builds the same global problem."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.lower.ir.task import parse_task

from ._mpi import needs_mpiexec

pytestmark = [needs_mpiexec, pytest.mark.mpi]

METHODS = ["rows", "edges", "spatial"]
REDUCERS = ["sum", "mean", "max", "min", "prod", "online_softmax"]


def _problem(n=37, density=0.12, seed=0, f=3):
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) < density
    dst, src = np.nonzero(a)
    order = rng.permutation(len(src))           # edge order differs from storage order
    g = tg.Graph.from_coo(src[order], dst[order], num_src=n, num_dst=n)
    data = {"x": rng.standard_normal((n, f)), "h": rng.standard_normal((n, f)),
            "w": rng.standard_normal((g.num_edges, 1)), "pos": rng.standard_normal((n, 2))}
    return g, data


def _layer(name):
    reducer = getattr(tg, name)()

    class Layer(tg.MessagePassing):
        def edge(self, src, dst, edge, scale):
            if name == "online_softmax":
                return self.reducer((src.x * dst.h).sum(axis=-1), src.x * scale)
            return tg.math.tanh(src.x * edge.w + dst.h) * scale

        def update(self, dst, aggregated, scale):
            return aggregated + 0.5 * dst.h

    Layer.reducer = reducer
    return Layer()


def _dist(g, data, method):
    return tg.distributed.partition(g, method=method,
                                    positions=data["pos"] if method == "spatial" else None)


def _call(layer, graph, x, h, w, scale=1.5):
    return layer(graph=graph, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=scale)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reducer", REDUCERS)
def test_forward_matches_one_process(method, reducer):
    g, d = _problem()
    dg = _dist(g, d, method)
    layer = _layer(reducer)
    y = _call(layer, dg, dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    want = np.asarray(_call(layer, g, d["x"], d["h"], d["w"]))
    np.testing.assert_allclose(dg.gather(np.asarray(y)), want, rtol=1e-12, atol=1e-12)
    root = dg.gather(np.asarray(y), root=0)
    assert (root is None) == (dg.comm.rank != 0)


@pytest.mark.parametrize("method", ["rows", "spatial"])
@pytest.mark.parametrize("reducer", REDUCERS)
def test_grad_matches_one_process(method, reducer):
    g, d = _problem(seed=1)
    dg = _dist(g, d, method)
    layer = _layer(reducer)

    def loss(x, h, w, scale, graph):
        return (_call(layer, graph, x, h, w, scale) ** 2).sum()

    args = (dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]), np.float64(1.5))
    got = tg.grad(loss, argnums=(0, 1, 2, 3))(*args, dg)
    want = tg.grad(loss, argnums=(0, 1, 2, 3))(d["x"], d["h"], d["w"], np.float64(1.5), g)
    np.testing.assert_allclose(dg.gather(np.asarray(got[0])), want[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dg.gather(np.asarray(got[1])), want[1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2])[dg.plan.edge_ids],
                               rtol=1e-9, atol=1e-9)
    # a replicated parameter's cotangent is this rank's part: the parts add up
    total = dg.comm.sum(np.asarray(got[3]), "test")
    np.testing.assert_allclose(total, want[3], rtol=1e-9)


def test_vjp_several_propagates_and_repeat():
    g, d = _problem(seed=2)
    dg = _dist(g, d, "edges")
    layer, mean = _layer("sum"), _layer("mean")

    def f(x, h, w, graph):
        s = tg.repeat(3, lambda s: 0.3 * _call(layer, graph, s, h, w), x)
        return _call(mean, graph, tg.math.sin(s), s, w)      # a second exchange, of sin(s)

    xl, hl, wl = dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"])
    out, back = tg.vjp(lambda x, h: f(x, h, wl, dg), xl, hl)
    want, back_g = tg.vjp(lambda x, h: f(x, h, d["w"], g), d["x"], d["h"])
    np.testing.assert_allclose(dg.gather(np.asarray(out)), want, rtol=1e-10, atol=1e-12)
    ct = np.random.default_rng(3).standard_normal(np.shape(want))
    for a, b in zip(back(dg.local(ct)), back_g(ct)):
        np.testing.assert_allclose(dg.gather(np.asarray(a)), b, rtol=1e-9, atol=1e-10)


def test_while_loop_condition_is_agreed():
    g, d = _problem(seed=7)
    dg = _dist(g, d, "rows")
    layer = _layer("sum")

    def f(x, h, w, graph):     # each rank's local max differs: the loop must still agree
        return tg.while_loop(lambda c: tg.math.max(tg.math.abs(c)) > 0.05,
                             lambda c: 0.5 * _call(layer, graph, c, h, w, 0.2), x, 8)

    # eager loops run on the reference interpreter: tg.jit runs them in the executor
    got = tg.jit(f)(dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]), dg)
    want = f(d["x"], d["h"], d["w"], g)
    np.testing.assert_allclose(dg.gather(np.asarray(got)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("overlap", [True, False])
def test_jit_captured_graph_and_both_schedules(overlap):
    g, d = _problem(n=60, seed=4)
    dg = _dist(g, d, "rows")
    dg.overlap = overlap
    layer = _layer("max")
    xl, hl, wl = dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"])
    f = tg.jit(lambda x: _call(layer, dg, x, hl, wl) + 1.0)
    with tg.profile() as prof:
        got = f(xl)
    np.testing.assert_allclose(dg.gather(np.asarray(got)),
                               np.asarray(_call(layer, g, d["x"], d["h"], d["w"])) + 1.0)
    assert prof.measured("halo")[-1]["order"] == ("overlapped" if overlap
                                                  else "communicate-then-compute")


def test_empty_partitions_more_ranks_than_rows():
    g = tg.Graph.from_csr([0, 2, 3, 3], [0, 2, 1], num_src=3)   # 3 rows, any rank count
    x = np.array([[1.0], [2.0], [4.0]])
    w = np.array([[1.0], [10.0], [100.0]])
    layer = _layer("sum")
    for method in ("rows", "edges"):
        dg = tg.distributed.partition(g, method=method)
        y = _call(layer, dg, dg.local(x), dg.local(x), dg.local_edges(w))
        want = np.asarray(_call(layer, g, x, x, w))
        np.testing.assert_allclose(dg.gather(np.asarray(y)), want)
        gx = tg.grad(lambda x, gr, ww: _call(layer, gr, x, x, ww).sum())
        np.testing.assert_allclose(dg.gather(np.asarray(gx(dg.local(x), dg, dg.local_edges(w)))),
                                   gx(x, g, w))


def test_explain_lists_the_halo_plan():
    g, d = _problem(seed=5)
    dg = _dist(g, d, "rows")
    layer = _layer("sum")
    kw = dict(graph=dg, src={"x": dg.local(d["x"])}, dst={"h": dg.local(d["h"])},
              edge={"w": dg.local_edges(d["w"])}, scale=1.0)
    assert "distributed measured" not in str(layer.explain(**kw))     # (not run)
    text = str(layer.explain(run=True, **kw))
    p = dg.plan
    assert f"{p.n_ghost} ghost rows" in text
    for q, a, b in p.recv:
        assert f"peer rank {q}: receive {b - a} ghost rows" in text
        assert f"({(b - a) * 3 * 8} B in" in text      # f64[3] source rows
    assert "distributed measured (overlapped)" in text
    launched = [line.split("distributed task: gf_task.launch ")[1].split(")")[0]
                for line in text.splitlines() if "distributed task: gf_task.launch" in line]
    assert sum(int(r.split(", ")[1]) - int(r.split("[")[1].split(",")[0])
               for r in launched) == p.n_owned     # the launches cover the owned rows
    assert any(r.startswith("boundary") for r in launched) == (p.n_owned > p.n_interior)
    # the Task IR the call ran, printed whole: it parses back to the same module
    module = text.split("task ir:\n", 1)[1]
    module = "\n".join(line[2:] for line in module.splitlines())
    with tg.profile() as prof:
        layer(**kw)
    assert module == str(prof.measured("halo")[-1]["module"]).rstrip("\n")
    parse_task(module).verify()


def test_mismatched_shapes_raise_on_every_rank():
    g, d = _problem(seed=6)
    dg = _dist(g, d, "rows")
    f = 2 + dg.comm.rank % 2        # ranks disagree on the feature width
    layer = _layer("sum")
    x = np.ones((dg.plan.n_owned, f))
    with pytest.raises(tg.DistributedError, match="ranks disagree on the program"):
        _call(layer, dg, x, x, np.ones((dg.num_edges, 1)))


@pytest.mark.parametrize("method", ["rows", "edges"])
def test_eager_repeat_over_a_distributed_graph_matches_one_process(method):
    """tg.repeat outside any trace runs its body on the distributed route (halo exchange per
    iteration), not the reference impl rule (which has no single CSR to read)."""
    g, d = _problem(seed=5)
    dg = _dist(g, d, method)
    layer = _layer("mean")

    def step(graph, w):
        return lambda s: 0.5 * _call(layer, graph, s, s, w)

    got = tg.repeat(3, step(dg, dg.local_edges(d["w"])), dg.local(d["x"]))
    want = tg.repeat(3, step(g, d["w"]), d["x"])
    np.testing.assert_allclose(dg.gather(np.asarray(got)), np.asarray(want), rtol=1e-10,
                               atol=1e-12)


def test_scan_and_cond_match_one_process_forward_and_backward():
    """tg.scan with per-step outputs and a tg.cond whose predicate each rank computes from
    its own rows (the branch is agreed: taken where any rank's predicate holds, which is the
    one-process predicate on a max), forward and backward, over a DistributedGraph. With
    "rows" on 2 ranks the ranks disagree at the first step and the predicate is false at
    the third, so both branches and the agreement run."""
    g, d = _problem(seed=11)
    dg = _dist(g, d, "rows")
    layer = _layer("sum")

    def f(x, h, w, graph):
        def step(c, k):
            c = 0.4 * _call(layer, graph, c, h, w)
            c = tg.cond(tg.math.max(tg.math.abs(c)) > 4.8, lambda a: 0.5 * a,
                        lambda a: a + k, c)
            return c, tg.math.sin(c) * k
        c, ys = tg.scan(step, x, np.array([0.5, 1.0, 1.5]))
        return c + tg.math.sum(ys, axis=0)

    xl, hl, wl = dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"])
    out, back = tg.vjp(lambda x, h: f(x, h, wl, dg), xl, hl)
    want, back_g = tg.vjp(lambda x, h: f(x, h, d["w"], g), d["x"], d["h"])
    np.testing.assert_allclose(dg.gather(np.asarray(out)), want, rtol=1e-10, atol=1e-12)
    ct = np.random.default_rng(12).standard_normal(np.shape(want))
    for a, b in zip(back(dg.local(ct)), back_g(ct)):
        np.testing.assert_allclose(dg.gather(np.asarray(a)), b, rtol=1e-9, atol=1e-10)
