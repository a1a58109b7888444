"""tg.grad / tg.vjp / tg.jit(tg.grad) run their programs after the program passes of stage
"execute" (tiga/opt): independent sum propagates over one radius/knn relation
share one walk, `a + (-b)` is `a - b`, a value the primal and the VJP both compute is
computed once. Gradients against the unrewritten program and float64 finite differences
of a brute-force numpy oracle; walk counts; the printed program stays as traced."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga import api, opt
from tiga.core.prims.graph import propagate_p
from tiga.opt import relation_kind, relation_kinds
from tiga.trace.staging import make_program
from tiga.xla_free_runtime.backends.cpu import generated as lg

N, F, H, OUT = 26, 3, 6, 2
KINDS = ["radius", "radius-truncated", "knn", "radius-captured", "csr"]


def radius_rows(pos, cutoff, max_neighbors=None):
    """Brute force: sources within `cutoff` of each point (itself excluded), ascending ids;
    truncated to the nearest `max_neighbors` (ties by id)."""
    dist = np.sqrt(((pos[None, :, :] - pos[:, None, :]) ** 2).sum(-1))
    rows = []
    for i in range(len(pos)):
        src = [j for j in range(len(pos)) if j != i and dist[i, j] <= cutoff]
        if max_neighbors is not None:
            src = sorted(sorted(src, key=lambda j: (dist[i, j], j))[:max_neighbors])
        rows.append(np.array(src, np.int64))
    return rows


def knn_rows(pos, k):
    dist = np.sqrt(((pos[None, :, :] - pos[:, None, :]) ** 2).sum(-1))
    return [np.array(sorted((j for j in range(len(pos)) if j != i),
                            key=lambda j: (dist[i, j], j))[:k], np.int64)
            for i in range(len(pos))]


def _walks(program) -> int:
    return sum(e.primitive is propagate_p for e in program.eqns)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    pos = rng.random((N, 3))
    x = rng.standard_normal((N, F))
    h = rng.random((N, 1)) + 0.5
    w1 = rng.standard_normal((3 + F, H)) / 2
    b1 = rng.standard_normal(H) / 4
    w2 = rng.standard_normal((H, OUT)) / 2
    b2 = rng.standard_normal(OUT) / 4
    return pos, x, h, w1, b1, w2, b2


def _csr(pos):
    rows = knn_rows(pos, 4)
    row_ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return row_ptr, np.concatenate(rows).astype(np.int64)


def _relation(kind, p, pos0):
    if kind == "radius":
        return tg.Graph.radius(p, 0.35)
    if kind == "radius-truncated":
        return tg.Graph.radius(p, 0.35, max_neighbors=4)
    if kind == "knn":
        return tg.Graph.knn(p, 5)
    if kind == "radius-captured":      # a concrete relation the function closes over
        return tg.Graph.radius(pos0, 0.35)
    return tg.Graph.from_csr(*_csr(pos0), num_src=N)


def _rows(kind, pos):
    if kind in ("radius", "radius-captured"):
        return radius_rows(pos, 0.35)
    if kind == "radius-truncated":
        return radius_rows(pos, 0.35, max_neighbors=4)
    if kind == "knn":
        return knn_rows(pos, 5)
    row_ptr, col = _csr(pos)
    return [col[row_ptr[i]:row_ptr[i + 1]] for i in range(N)]


def _loss(kind, pos0):
    """Two propagates over one relation (an edge MLP on the displacement and a product of a
    source and a destination field): forward walks and src/dst cotangent walks."""

    def loss(p, x, h, w1, b1, w2, b2):
        g = _relation(kind, p, pos0)

        def mlp(s, d, e):
            z = tg.math.concatenate([s.p - d.p, s.x], axis=-1) @ w1 + b1
            return tg.math.relu(z) @ w2 + b2

        def prod(s, d, e):
            return s.x * d.h * tg.math.sum((s.p - d.p) * (s.p - d.p), axis=-1)[..., None]

        y1 = tg.propagate(g, mlp, tg.sum(), src={"x": x, "p": p}, dst={"p": p})
        y2 = tg.propagate(g, prod, tg.sum(), src={"x": x, "p": p}, dst={"h": h, "p": p})
        return tg.math.sum(y1 * y1) + tg.math.mean(y2 * y2)
    return loss


def _oracle(kind, pos0):
    rows = _rows(kind, pos0)   # the topology of the unperturbed positions

    def loss(p, x, h, w1, b1, w2, b2):
        y1, y2 = np.zeros((N, OUT)), np.zeros((N, F))
        for i, src in enumerate(rows):
            if len(src) == 0:
                continue
            disp = p[src] - p[i]
            z = np.concatenate([disp, x[src]], axis=1) @ w1 + b1
            y1[i] = (np.maximum(z, 0) @ w2 + b2).sum(axis=0)
            y2[i] = (x[src] * h[i] * (disp * disp).sum(axis=1)[:, None]).sum(axis=0)
        return float((y1 * y1).sum() + (y2 * y2).mean())
    return loss


def _fd(f, args, k, eps=1e-6):
    out = np.zeros_like(args[k])
    for i in np.ndindex(args[k].shape):
        a = [np.array(v) for v in args]
        a[k][i] += eps
        up = f(*a)
        a[k][i] -= 2 * eps
        out[i] = (up - f(*a)) / (2 * eps)
    return out


@pytest.fixture
def spy(monkeypatch):
    """The programs the "execute" passes produce, in call order."""
    seen = []
    real = opt.optimize_program

    def record(program, facts):
        out = real(program, facts)
        if facts.stage == "execute":
            seen.append(out[0])
        return out

    monkeypatch.setattr(opt, "optimize_program", record)
    return seen


def _unrewritten(monkeypatch):
    real = opt.optimize_program

    def skip_execute(program, facts):
        return (program, []) if facts.stage == "execute" else real(program, facts)
    monkeypatch.setattr(opt, "optimize_program", skip_execute)


# walks of the executed VJP program: forward y1, y2 (independent: one walk where fused),
# then the cotangent walks grouped by destination (pos, h) and by source (x, pos)
WALKS = {"radius": 2, "radius-captured": 2, "radius-truncated": 3, "knn": 3}


@pytest.mark.parametrize("kind", KINDS)
def test_grad_matches_unrewritten_and_finite_differences(kind, spy, monkeypatch):
    args = _data(KINDS.index(kind))
    nums = tuple(range(7))
    grads = tg.grad(_loss(kind, args[0]), argnums=nums)(*args)
    executed = spy[-1]
    with monkeypatch.context() as m:
        _unrewritten(m)
        staged = api._Traced(_loss(kind, args[0]), args, nums, False)
        traced = opt.optimize_program(api.vjp_program(staged.program, staged.wrt),
                                      opt.ProgramFacts("vjp"))[0]
        plain = tg.grad(_loss(kind, args[0]), argnums=nums)(*args)
    for got, want in zip(grads, plain):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)
    oracle = _oracle(kind, args[0])
    for k, got in enumerate(grads):
        np.testing.assert_allclose(np.asarray(got), _fd(oracle, args, k), rtol=1e-5,
                                   atol=1e-6, err_msg=f"argument {k}")
    if kind == "csr":   # only radius/knn walks (whose traversal dominates) are merged
        assert _walks(executed) == _walks(traced)
    else:
        assert _walks(executed) == WALKS[kind] < _walks(traced)


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_jit_of_grad_runs_fewer_walks_and_prints_the_traced_program(kind, monkeypatch):
    args = _data(7)
    loss = _loss(kind, args[0])
    runs = []
    real_run = lg.GeneratedPlan.run

    def rec(self, eqn, *a):
        runs.append((len(eqn.outputs), eqn.params["reduce_by"]))
        return real_run(self, eqn, *a)

    monkeypatch.setattr(lg.GeneratedPlan, "run", rec)
    jitted = tg.jit(tg.grad(loss, argnums=(0, 1, 2)))
    got = jitted(*args)
    fused_runs, runs[:] = list(runs), []
    with monkeypatch.context() as m:
        _unrewritten(m)
        want = tg.jit(tg.grad(loss, argnums=(0, 1, 2)))(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    assert len(fused_runs) < len(runs)   # the rewritten program walks the relation fewer times
    assert any(n > 1 for n, _ in fused_runs)   # a multi-output walk
    compiled = jitted.lower(*args).compile()
    printed = jitted.lower(*args).ir("program")
    assert printed.count("propagate") > _walks(api._executed_passes(
        compiled.program, relation_kinds(compiled.program)))
    text = str(compiled.explain())
    assert f"all {WALKS[kind]} propagate(s) compile" in text


def test_vjp_fn_reuses_the_rewritten_program(spy):
    args = _data(3)
    loss = _loss("radius", args[0])
    value, vjp_fn = tg.vjp(loss, *args)
    first = vjp_fn(np.float64(1.0))
    second = vjp_fn(np.float64(2.0))
    grads = tg.grad(loss, argnums=tuple(range(7)))(*args)
    for a, b, c in zip(first, second, grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(b), 2 * np.asarray(c), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(float(np.asarray(value)), _oracle("radius", args[0])(*args),
                               rtol=1e-12)
    # forward, the first vjp_fn call (rewritten then), tg.grad: the second call reused it
    assert len(spy) == 3



def test_relation_kinds_agree_with_the_runtime():
    """The rewrite's symmetric/directed test (trace layer) is the runtime's, for concrete
    relations and for relations a traced program generates."""
    rng = np.random.default_rng(4)
    pos, q = rng.random((20, 3)), rng.random((7, 3))
    makers = [lambda p, q: tg.Graph.radius(p, 0.3),
              lambda p, q: tg.Graph.radius(p, 0.3, loop=True),
              lambda p, q: tg.Graph.radius(p, 0.3, max_neighbors=3),
              lambda p, q: tg.Graph.radius(p, 0.3, query=q),
              lambda p, q: tg.Graph.knn(p, 4), lambda p, q: tg.Graph.knn(p, 3, query=q)]
    for make in makers:
        g = make(pos, q)
        assert relation_kind(g) == ("symmetric" if lg.symmetric(g) else "directed")

        def f(p, q, make=make):
            return tg.math.sum(tg.propagate(make(p, q), lambda s, d, e: e.distance[..., None],
                                            tg.sum()))
        program = make_program(f)(pos, q)
        generated = lg.generated_relations(program)
        kinds = relation_kinds(program)
        assert generated and set(generated) == set(kinds)
        for k, gt in generated.items():
            assert kinds[k] == ("symmetric" if lg.symmetric(gt) else "directed")
    assert relation_kind(tg.Graph.from_csr(*_csr(pos), num_src=20)) is None


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_relation_passed_as_an_argument(kind, spy, monkeypatch):
    """A concrete relation among the arguments: its kind is read at the call."""
    rng = np.random.default_rng(6)
    pos, x, h = rng.random((40, 3)), rng.standard_normal((40, 2)), rng.random((40, 1))
    g = tg.Graph.radius(pos, 0.3) if kind == "radius" else tg.Graph.knn(pos, 5)

    def loss(x, h, g):
        y = tg.propagate(g, lambda s, d, e: s.x * d.h, tg.sum(), src={"x": x}, dst={"h": h})
        return tg.math.sum(y * y)

    got = tg.grad(loss, argnums=(0, 1))(x, h, g)
    jitted = tg.jit(tg.grad(loss, argnums=(0, 1)))(x, h, g)
    # forward, then the dst (h) and src (x) cotangent walks: one walk where symmetric
    assert [_walks(p) for p in spy] == ([2, 2] if kind == "radius" else [3, 3])
    rows = radius_rows(pos, 0.3) if kind == "radius" else knn_rows(pos, 5)
    w = np.zeros((40, 40))
    for i, src in enumerate(rows):
        w[i, src] = 1.0
    y = h * (w @ x)
    want = (2 * w.T @ (h * y), (2 * y * (w @ x)).sum(axis=1, keepdims=True))
    for a, b, c in zip(got, jitted, want):
        np.testing.assert_allclose(np.asarray(a), c, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(b), c, rtol=1e-12, atol=1e-12)
