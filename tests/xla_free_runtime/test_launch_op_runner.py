"""The launch op is the runner (issue 37): every compiled kernel a call runs is launched through
the backend table (a recording backend registered in place of cpu-llvm sees each one), each
launched kernel is printed in the Task module of that call (`ir("task", **call)`, or
`tg.jit(f).lower(*args).ir("task")`), and a call signature enters lower/pipeline once, however
many equations or pages it has (a warm call: not at all).

Oracles: the kernels the recording backend saw (names derived from the ops, not from the
printed text) against the kernels parsed back out of the printed module; the values against
the reference interpreter (`.reference`) and numpy."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tiga as tg
from tiga.core.errors import UnsupportedError
from tiga.lower import CPU_LLVM_AVAILABLE, pipeline
from tiga.testing import printed_kernels, recording
from tiga.xla_free_runtime import backends
from tiga.xla_free_runtime.caches import equations as equation_cache

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * 2.0 + dst.b


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


def _csr(n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rp = np.arange(0, k * n + 1, k, dtype=np.int64)
    return rp, rng.integers(0, n, k * n).astype(np.int32)


def _fields(n: int, f: int = 3, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.random((n, f)), rng.random((n, f)), rng.random((n, 3))


def _check_printed(rec, text: str) -> None:
    ran = rec.names()
    assert ran, "no kernel was launched through the backend table"
    missing = ran - printed_kernels(text)
    assert not missing, f"launched but not in the call's Task module: {sorted(missing)}"


def test_csr_propagate_launches_through_the_table_and_is_printed():
    rp, ci = _csr(300, 4)
    x, b, _ = _fields(300)
    call = dict(graph=tg.Graph.from_csr(rp, ci), src={"x": x}, dst={"b": b})
    with recording() as rec:
        got = np.asarray(Weighted()(**call))
        text = Weighted().ir("task", **call)
    np.testing.assert_allclose(got, np.asarray(Weighted().reference(**call)), rtol=1e-12)
    assert len(rec.launched) == 1
    _check_printed(rec, text)


def _three(g_csr, g_tri, pos):
    def f(x, b):
        r = tg.Graph.radius(pos, 0.25)
        h = Weighted()(graph=g_csr, src={"x": x}, dst={"b": b})
        h = Weighted()(graph=r, src={"x": h}, dst={"b": b})
        return Weighted()(graph=g_tri, src={"x": h}, dst={"b": b})
    return f


def test_three_propagates_over_csr_radius_and_triangular():
    n = 240
    rp, ci = _csr(n, 5)
    x, b, pos = _fields(n)
    f = tg.jit(_three(tg.Graph.from_csr(rp, ci), tg.Graph.triangular(n), pos))
    with recording() as rec:
        got = np.asarray(f(x, b))
    want = np.asarray(tg.jit(_three(tg.Graph.from_csr(rp, ci), tg.Graph.triangular(n),
                                     pos)).lower(x, b).compile()(x, b))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert len(rec.names()) >= 3        # three kernels (and the radius cell directory)
    _check_printed(rec, f.lower(x, b).ir("task"))


@pytest.mark.parametrize("kind", ["knn", "radius"])
def test_generated_relation_and_its_directory_build(kind):
    n = 300
    x, b, pos = _fields(n)
    g = tg.Graph.knn(pos, 6) if kind == "knn" else tg.Graph.radius(pos, 0.2)
    call = dict(graph=g, src={"x": x}, dst={"b": b})
    with recording() as rec:
        Weighted()(**call)
        text = Weighted().ir("task", **call)
    assert any(name.startswith("cell_directory_") for name in rec.names())
    _check_printed(rec, text)


def test_causal_attention_and_its_gradient():
    n, heads, width = 160, 2, 16
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, heads, width)).astype(np.float32) for _ in range(3))
    g = tg.Graph.triangular(n)

    def loss(q, k, v):
        y = Attention()(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)
        return tg.math.sum(y * y)

    call = dict(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)
    with recording() as rec:
        Attention()(**call)
        text = Attention().ir("task", **call)
    _check_printed(rec, text)
    step = tg.jit(tg.grad(loss, argnums=(0, 1, 2)))
    with recording() as rec:
        grads = step(q, k, v)
    assert len(rec.launched) >= 2       # the forward and the backward kernels
    _check_printed(rec, step.lower(q, k, v).ir("task"))
    assert all(np.isfinite(np.asarray(d)).all() for d in grads)


def _store(path, rp, ci, n):
    with tg.store.create(path, num_src=n, num_dst=n, overwrite=True) as w:
        half = n // 2
        w.append_csr_chunk(rp[:half + 1], ci[:rp[half]])
        w.append_csr_chunk(rp[half:] - rp[half], ci[rp[half]:])
    return tg.Graph.open(path)


def test_paged_store_forward_and_gradient(tmp_path):
    n = 400
    rp, ci = _csr(n, 4)
    x, b, _ = _fields(n)
    g, mem = _store(tmp_path / "s", rp, ci, n), tg.Graph.from_csr(rp, ci)
    call = dict(graph=g, src={"x": x}, dst={"b": b})
    with tg.scope(page_rows=16):               # 25 pages
        with recording() as rec:
            got = np.asarray(Weighted()(**call))
            text = Weighted().ir("task", **call)
        assert text.count('"gf_task.launch"') >= 20
        _check_printed(rec, text)
        np.testing.assert_allclose(got, np.asarray(Weighted()(graph=mem, src={"x": x},
                                                              dst={"b": b})), rtol=1e-12)

        def loss(graph):
            return lambda x: tg.math.sum(Weighted()(graph=graph, src={"x": x},
                                                    dst={"b": b}) ** 2)
        step = tg.jit(tg.grad(loss(g)))
        with recording() as rec:
            dx = np.asarray(step(x))
        _check_printed(rec, step.lower(x).ir("task"))
    np.testing.assert_allclose(dx, np.asarray(tg.grad(loss(mem))(x)), rtol=1e-10)


# ---- the backend table ---------------------------------------------------------------------

def test_register_replaces_the_entry_of_its_target_and_checks_the_interface():
    inner = backends.BACKENDS["cpu-llvm"]
    with recording() as rec:
        assert backends.BACKENDS["cpu-llvm"] is rec and rec.inner is inner
    assert backends.BACKENDS["cpu-llvm"] is inner

    class Half:
        target = "half"

        def render(self, op):
            return None

    with pytest.raises(UnsupportedError, match="needs compile, launch"):
        backends.register(Half())
    with pytest.raises(UnsupportedError, match="no backend is registered for target 'nope'"):
        backends.backend_for("nope")


# ---- one lowering per call signature -------------------------------------------------------

class _Count:
    """Counts outermost calls into tiga.lower.pipeline's functions (nested ones are the same
    lowering)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self._depth = threading.local()
        for name, fn in list(vars(pipeline).items()):
            # (its private functions are reached through the public ones; the others named
            # here read settings or names and lower nothing)
            if callable(fn) and getattr(fn, "__module__", None) == pipeline.__name__ and \
                    not isinstance(fn, type) and not name.startswith("_") and \
                    name not in ("quiet_dumps", "module_name", "dumps_requested"):
                monkeypatch.setattr(pipeline, name, self._wrap(fn))

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.calls += 1
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth
        return counted

    def take(self) -> int:
        n, self.calls = self.calls, 0
        return n


def test_a_cold_signature_lowers_once_and_a_warm_call_never(monkeypatch):
    count = _Count(monkeypatch)
    n = 180
    rp, ci = _csr(n, 3, seed=7)
    x, b, pos = _fields(n, f=5)
    g = tg.Graph.from_csr(rp, ci)
    layer = Weighted()
    layer(graph=g, src={"x": x}, dst={"b": b})
    assert count.take() == 1
    for _ in range(3):
        layer(graph=g, src={"x": x}, dst={"b": b})
    assert count.take() == 0
    f = tg.jit(_three(g, tg.Graph.triangular(n), pos))      # three propagates, one lowering
    f(x, b)
    assert count.take() == 1
    f(x, b)
    assert count.take() == 0
    step = tg.jit(tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x},
                                                      dst={"b": b}) ** 2)))
    step(x)
    assert count.take() <= 2
    step(x)
    assert count.take() == 0


def test_a_paged_call_lowers_once_whatever_its_pages(monkeypatch, tmp_path):
    n = 400
    rp, ci = _csr(n, 4, seed=5)
    x, b, _ = _fields(n, f=4)
    g = _store(tmp_path / "s", rp, ci, n)
    count = _Count(monkeypatch)
    layer = Weighted()
    with tg.scope(page_rows=16):
        layer(graph=g, src={"x": x}, dst={"b": b})
        assert count.take() == 1
        layer(graph=g, src={"x": x}, dst={"b": b})
        assert count.take() == 0
        step = tg.jit(tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x},
                                                          dst={"b": b}) ** 2)))
        step(x)                 # forward and backward (the transposed store) by pages
        assert count.take() <= 2
        step(x)
        assert count.take() == 0


class _MaxNear(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x * tg.math.exp(-edge.distance) + dst.b


@pytest.mark.parametrize("kind", ["radius", "knn"])
@pytest.mark.parametrize("layer", [Weighted, _MaxNear], ids=["sum", "max"])
def test_a_generated_relation_and_its_gradient_lower_once(monkeypatch, kind, layer):
    """The forward's cell walk and the backward's walk (roles swapped over a symmetric radius
    relation; the materialised CSR of a kNN one) come from one lowering. A kNN relation its
    backward materialised is bound to that CSR from the next call on: one lowering more,
    then none."""
    n = 300
    x, b, pos = _fields(n, seed=9)
    g = tg.Graph.radius(pos, 0.2) if kind == "radius" else tg.Graph.knn(pos, 5)
    count = _Count(monkeypatch)
    mp = layer()
    step = tg.jit(tg.grad(lambda x: tg.math.sum(mp(graph=g, src={"x": x}, dst={"b": b}) ** 2)))
    first = np.asarray(step(x))
    assert count.take() == 1
    again = np.asarray(step(x))
    assert count.take() <= (1 if kind == "knn" else 0)
    np.testing.assert_allclose(np.asarray(step(x)), first, rtol=1e-12)
    assert count.take() == 0
    np.testing.assert_allclose(again, first, rtol=1e-12)


def test_attention_and_its_gradient_lower_once(monkeypatch):
    n = 160
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((n, 2, 16)).astype(np.float32) for _ in range(3))
    g = tg.Graph.triangular(n)
    count = _Count(monkeypatch)
    step = tg.jit(tg.grad(lambda q, k, v: tg.math.sum(Attention()(
        graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.3) ** 2),
        argnums=(0, 1, 2)))
    step(q, k, v)
    assert count.take() == 1
    step(q, k, v)
    assert count.take() == 0


# ---- what the runtime used to lower one equation at a time ----------------------------------

class _MeanNear(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return src.x * tg.math.exp(-edge.distance)


def test_a_radius_degree_count_is_lowered_with_its_call(monkeypatch):
    """The backward of a mean over a radius relation generated in the program counts its
    degrees by a fused walk: that kernel is lowered with the call (one more launch of the
    same lowering), the relation is never materialised, and the gradient equals the one over
    the relation's own CSR."""
    n = 240
    x, _, pos = _fields(n, seed=4)
    layer = _MeanNear()
    step = tg.jit(tg.grad(lambda x, pos: tg.math.sum(
        layer(graph=tg.Graph.radius(pos, 0.25), src={"x": x}) ** 2)))
    count = _Count(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(tg.Graph, "resolve_csr", _never)
        got = np.asarray(step(x, pos))
        assert count.take() == 1     # (forward and backward are one program under tg.jit)
        np.testing.assert_array_equal(np.asarray(step(x, pos)), got)
        assert count.take() == 0
    assert any(ops for _, ops in equation_cache.entries("count_launch"))
    g = tg.Graph.radius(pos, 0.25)
    rp, ci = g.resolve_csr()
    dist = np.linalg.norm(pos[ci] - np.repeat(pos, np.diff(rp), axis=0), axis=1)

    class Explicit(tg.MessagePassing):
        reducer = tg.mean()

        def edge(self, src, dst, edge):
            return src.x * tg.math.exp(-edge.d)
    csr = tg.Graph.from_csr(rp, ci, num_src=n)
    want = tg.grad(lambda x: tg.math.sum(Explicit()(graph=csr, src={"x": x},
                                                    edge={"d": dist}) ** 2))(x)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-10, atol=1e-12)


def _never(*_):
    raise AssertionError("the radius relation was materialised")


def test_fields_over_the_budget_page_from_the_calls_lowering(monkeypatch, tmp_path):
    """A relation held in memory whose disk-tier fields exceed the host budget runs by pages:
    its one-page module comes from the call's one lowering (no lowering per equation), and
    the result equals the in-memory call's."""
    n = 600
    rp, ci = _csr(n, 3, seed=2)
    x, b, _ = _fields(n, f=16, seed=3)
    g = tg.Graph.from_csr(rp, ci)
    want = np.asarray(Weighted()(graph=g, src={"x": x}, dst={"b": b}))
    with tg.scope(spill_dir=tmp_path):
        xd = tg.asarray(x).to("disk")
    count = _Count(monkeypatch)
    with tg.scope(budgets={"host": "120KB"}, page_rows=64, spill_dir=tmp_path), \
            tg.profile() as prof:
        got = np.asarray(Weighted()(graph=g, src={"x": xd}, dst={"b": b}))
        assert prof.measured("paged")[-1].pages == -(-n // 64)
    assert count.take() == 1
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_cond_inside_a_loop_compiles_and_lowers_once_per_program(monkeypatch):
    """tg.cond's branches are regions of the Task IR: a loop whose body branches lowers (the
    program, the body and each branch once: strict mode finds no fallback), and a warm call
    lowers nothing."""
    n = 150
    rp, ci = _csr(n, 3, seed=8)
    x, b, _ = _fields(n, seed=6)
    g = tg.Graph.from_csr(rp, ci)
    layer = Weighted()

    def f(x):
        def body(c):
            c = 0.3 * layer(graph=g, src={"x": c}, dst={"b": b})
            return tg.cond(tg.math.max(c) > 1.0, lambda a: 0.5 * a, lambda a: a + 1.0, c)
        return tg.repeat(3, body, x)

    count = _Count(monkeypatch)
    step = tg.jit(f)
    with _strict():
        got = np.asarray(step(x))
        assert 1 <= count.take() <= 4
        np.testing.assert_array_equal(np.asarray(step(x)), got)
        assert count.take() == 0
    c = x
    for _ in range(3):
        c = 0.3 * np.asarray(layer.reference(graph=g, src={"x": c}, dst={"b": b}))
        c = 0.5 * c if c.max() > 1.0 else c + 1.0
    np.testing.assert_allclose(got, c, rtol=1e-12)


class _strict:
    """tg.config.strict for the block (strict mode refuses any reference fallback)."""

    def __enter__(self):
        self.was = tg.config.strict
        tg.config.strict = True

    def __exit__(self, *exc):
        tg.config.strict = self.was


def test_printing_a_calls_task_module_reuses_its_lowering(monkeypatch):
    """ir("task") prints the module the call's one lowering gave: printed after the call it
    lowers nothing, and a call after a print finds the print's lowering."""
    count = _Count(monkeypatch)
    n = 150
    rp, ci = _csr(n, 3, seed=11)
    x, b, pos = _fields(n, f=4)
    g = tg.Graph.from_csr(rp, ci)
    f = tg.jit(_three(g, tg.Graph.triangular(n), pos))
    f(x, b)
    assert count.take() == 1
    text = f.lower(x, b).ir("task")
    assert count.take() == 0
    assert "gf_task.launch" in text
    h = tg.jit(_three(g, tg.Graph.triangular(n), pos))
    printed = h.lower(x, b).ir("task")
    assert count.take() == 1
    h(x, b)
    assert count.take() == 0
    assert printed == text.replace(text.split("@", 1)[1].split(" ", 1)[0],
                                   printed.split("@", 1)[1].split(" ", 1)[0], 1)
