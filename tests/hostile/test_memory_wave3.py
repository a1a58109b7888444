"""Memory that scales with the relation (issue 27, items 1 and 2).

`tg.grad` through an implicit relation (dense, triangular, cu_seqlens, stencil) walks its
transpose natively, as the forward walks the relation: peak RSS may grow by the fields and
results only, never by the edges. A CSR whose sources are sparse is transposed over the
sources with edges (arrays sized by the edges, not by num_src). A non-periodic stencil
forward computes edge ids from the lattice (no per-point array). Peak RSS growth is measured
in a subprocess around one call (/proc/self/clear_refs resets the peak); gradients are checked
against the reference interpreter (whole program) and float64 finite differences."""
from __future__ import annotations

import sys
from pathlib import Path

from ._run import check_cases

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peak_rss import PROBE  # noqa: E402

MEMORY = PROBE + '''

MiB = 1 << 20
SLACK = 16 * MiB

class Scale(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * 2.0

layer = Scale()

def grad_of(g, x):
    return tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x})))(x)

def forward(g, x):
    return layer(graph=g, src={"x": x})

def index_bytes(g):
    """What the relation itself stores: 0 for an implicit kind."""
    return 0 if g._csr is None else sum(a.nbytes for a in g._csr)

def check(make, small, big, run, dtype, fields, what):
    """run() on make(big) grows the peak RSS by at most `fields` arrays of num_src rows
    (the field, its result, the cotangent seed), the index bytes and SLACK; make(small)
    compiles first, so the call measured reuses the kernels."""
    g0 = make(small)
    run(g0, np.ones(g0.num_src, dtype))
    g = make(big)
    x = np.ones(g.num_src, dtype)
    stored = index_bytes(g)     # (before the call: what it builds is what is measured)
    out, grown = peak_growth(lambda: run(g, x))
    allowed = fields * x.nbytes + stored + SLACK
    per_edge = grown / max(g.num_edges, 1)
    assert grown <= allowed, (f"{what}: peak RSS grew {grown / MiB:.1f} MiB over "
                              f"{g.num_edges} edges ({per_edge:.2f} B/edge), allowed "
                              f"{allowed / MiB:.1f} MiB")
    return g, out
'''

IMPLICIT_GRADS = MEMORY + '''
@case
def dense_grad_needs_no_edge_memory():
    # 36M edges: ~1.1 GiB when the transposed CSR was built
    g, gx = check(lambda n: tg.Graph.dense(n), 40, 6000, grad_of, np.float32, 3, "dense")
    same(np.asarray(gx), np.full(6000, 2.0 * 6000, np.float32))

@case
def dense_rectangular_grad():
    g, gx = check(lambda n: tg.Graph.dense(n, 2 * n), 30, 4000, grad_of, np.float32, 3,
                  "dense(S, 2S)")
    same(np.asarray(gx), np.full(4000, 2.0 * 8000, np.float32))

@case
def triangular_grad_needs_no_edge_memory():
    n = 8000
    g, gx = check(lambda n: tg.Graph.triangular(n), 40, n, grad_of, np.float32, 3,
                  "triangular")
    # source s is read by destinations s..n-1
    same(np.asarray(gx), 2.0 * np.arange(n, 0, -1).astype(np.float32))

@case
def cu_seqlens_grads_need_no_edge_memory():
    for causal in (True, False):
        make = lambda n: tg.Graph.cu_seqlens([0, n // 2, n // 2, n], causal=causal)
        g, gx = check(make, 40, 9000, grad_of, np.float32, 3, f"cu_seqlens causal={causal}")
        pos = np.arange(4500)
        want = (4500 - pos) if causal else np.full(4500, 4500)
        same(np.asarray(gx), 2.0 * np.concatenate([want, want]).astype(np.float32))

@case
def stencil_grad_needs_no_edge_memory():
    offsets = [(0, 1), (1, 0), (0, -1), (-1, 0), (0, 0)]
    make = lambda n: tg.Graph.stencil((n, n), offsets)
    g, gx = check(make, 20, 2500, grad_of, np.float32, 3, "stencil")
    # point p is read once per offset whose reader p - offset is inside
    n = 2500
    inner = np.full((n, n), 5.0)
    inner[0, :] -= 1; inner[-1, :] -= 1; inner[:, 0] -= 1; inner[:, -1] -= 1
    same(np.asarray(gx).reshape(n, n), (2.0 * inner).astype(np.float32))

@case
def max_grad_finds_the_first_extremal_edge_past_2_24_edges():
    # 17.6M edges: edge ids compared in float32 rounded in pairs, and the cotangent of a
    # row's maximum leaked to the edge next to it
    class Top(tg.MessagePassing):
        reducer = tg.max()

        def edge(self, src, dst, edge):
            return src.x * 2.0

    top, n = Top(), 4200
    x = np.random.default_rng(0).random(n).astype(np.float32)
    gx = np.asarray(tg.grad(lambda x: tg.math.sum(top(graph=tg.Graph.dense(n),
                                                      src={"x": x})))(x))
    want = np.zeros(n, np.float32)
    want[np.argmax(x)] = 2.0 * n      # every row's maximum is the same source
    same(gx, want)
'''


EXTREMUM_GRADS = MEMORY + """
class Extremum(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return src.x * 2.0

def extremum_grad(name):
    layer = Extremum(getattr(tg, name)())
    return lambda g, x: tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x})))(x)

def first_source(g):
    # every message ties (x is ones): each row's cotangent goes to its first edge's source
    # (read from a copy of the relation resolved to its CSR; rows without edges get none)
    if g.kind == "triangular":
        return np.zeros(g.num_dst, np.int64)
    row_ptr, col_idx = tg.Graph.stencil(g.params["shape"], g.params["offsets"]).resolve_csr()
    return col_idx[row_ptr[:-1][np.diff(row_ptr) > 0]]

@case
def dense_max_grad_holds_no_edge_ids():
    # dense(6000), 36M edges: an int64 id per edge (275 MiB) and a peak of +824 MiB before
    g, gx = check(lambda n: tg.Graph.dense(n), 40, 6000, extremum_grad("max"), np.float32, 3,
                  "dense max")
    want = np.zeros(6000, np.float32)
    want[0] = 2.0 * 6000          # ties everywhere: every row's first edge reads source 0
    same(np.asarray(gx), want)
    assert g._csr is None

@case
def triangular_and_stencil_min_grads_hold_no_edge_ids():
    offsets = [(0, 1), (1, 0), (0, -1), (-1, 0), (0, 0)]
    # (the small call compiles the kernels the big one runs: a lattice large enough for
    # the threaded schedule.) Per point, not per edge: the forward's result, the seed, each
    # row's first extremal key, the point ids (int32) and the gradient; before, 20M edges of
    # the stencil grew the peak by 488 MiB (8-byte edge ids, copied by the CSE pass)
    for make, small, big, what in [
            (lambda n: tg.Graph.triangular(n), 20, 7000, "triangular min"),
            (lambda n: tg.Graph.stencil((n, n), offsets), 400, 2000, "stencil min")]:
        g, gx = check(make, small, big, extremum_grad("min"), np.float32, 5, what)
        assert g._csr is None
        want = np.bincount(first_source(g), minlength=g.num_src) * 2.0
        same(np.asarray(gx), want.astype(np.float32))
"""


def test_max_min_grads_over_implicit_relations_hold_no_edge_ids():
    check_cases(EXTREMUM_GRADS, timeout=240)


def test_grad_through_implicit_relations_needs_no_edge_memory():
    check_cases(IMPLICIT_GRADS, timeout=240)


STENCIL_FORWARD = MEMORY + '''
@case
def nonperiodic_stencil_forward_allocates_nothing_per_point():
    # 9M points of float16: ~200 MiB of per-point tables before (~22 B a point)
    offsets = [(0, 1), (1, 0), (0, -1), (-1, 0), (0, 0)]
    for periodic in (False, True):
        make = lambda n: tg.Graph.stencil((n, n), offsets, periodic=periodic)
        g, y = check(make, 20, 3000, forward, np.float16, 1, f"stencil periodic={periodic}")
        deg = np.full((3000, 3000), 5.0)
        if not periodic:
            deg[0, :] -= 1; deg[-1, :] -= 1; deg[:, 0] -= 1; deg[:, -1] -= 1
        same(np.asarray(y).reshape(3000, 3000), (2.0 * deg).astype(np.float16))

@case
def explain_reports_nothing_materialised():
    g = tg.Graph.stencil((30, 40), [(0, 1), (2, -1), (0, 0)])
    text = str(layer.explain(graph=g, src={"x": np.ones(g.num_src)}))
    assert "materializes = []" in text and "materialized:" not in text, text
    assert g._csr is None
'''


def test_stencil_forward_allocates_nothing_per_lattice_point():
    check_cases(STENCIL_FORWARD, timeout=180)


SPARSE_SOURCES = MEMORY + '''
from tiga.testing import reference_grad

@case
def transposed_arrays_are_sized_by_the_edges():
    g = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([2**31 - 2, 5, 7]),
                          num_src=2**31 - 1)
    (row_ids, rp, ci, perm), grown = peak_growth(g.transpose_rows)
    assert grown <= SLACK, f"transpose_rows grew the peak RSS by {grown / MiB:.1f} MiB"
    assert row_ids.tolist() == [5, 7, 2**31 - 2] and rp.tolist() == [0, 1, 2, 3]
    assert ci.tolist() == [0, 1, 0] and perm.tolist() == [1, 2, 0]

@case
def sparse_source_grad_is_sized_by_the_edges():
    # 20M sources, 3 edges: the gradient itself (80 MB) plus, before, a 160 MB transposed
    # row_ptr and a 160 MB bincount
    make = lambda n: tg.Graph.from_csr(np.array([0, 2, 3]), np.array([n - 1, 5, n // 2]),
                                       num_src=n)
    g, gx = check(make, 300_000, 20_000_000, grad_of, np.float32, 1, "sparse CSR")
    gx = np.asarray(gx)
    assert gx.shape == (20_000_000,) and gx.dtype == np.float32
    hit = [5, 10_000_000, 19_999_999]
    same(gx[hit], np.full(3, 2.0, np.float32))
    assert np.count_nonzero(gx) == 3

@case
def explain_names_the_walk_over_sources_with_edges():
    g = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([99_999, 5, 7]), num_src=100_000)
    x = np.ones(g.num_src)
    f = tg.jit(tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x}))))
    text = str(f.lower(x).compile().explain())
    assert "sources that have edges only" in text, text
    assert "transposed CSR + permutation over the sources with edges" in text, text
'''


def test_transposed_csr_is_sized_by_its_edges():
    check_cases(SPARSE_SOURCES, timeout=180)


GRADIENTS = '''
from tiga.testing import reference_grad

rng = np.random.default_rng(7)

class Mixed(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.h * src.x

def relations():
    offs = [(0, 0), (1, 0), (-1, 2), (0, -3), (1, 0), (2, 1)]
    src = rng.integers(0, 200_000, 40)
    yield "dense", tg.Graph.dense(230, 170)
    yield "triangular", tg.Graph.triangular(260)
    yield "cu_causal", tg.Graph.cu_seqlens([0, 120, 120, 300, 301], causal=True)
    yield "cu_full", tg.Graph.cu_seqlens([0, 120, 120, 300, 301], causal=False)
    yield "stencil", tg.Graph.stencil((150, 140), offs)
    yield "stencil_periodic", tg.Graph.stencil((150, 140), offs, periodic=True)
    yield "stencil_3d", tg.Graph.stencil((3, 2, 4), [(0, 0, 1), (1, -1, 0), (-1, 0, 0)])
    yield "stencil_wide_offsets", tg.Graph.stencil((3, 4), [(5, 0), (0, 1), (-7, 9)],
                                                   periodic=True)
    yield "sparse_sources", tg.Graph.from_coo(src, rng.integers(0, 30, 40), num_src=200_000,
                                              num_dst=30)

def loss(layer, g, c, ref):
    fn = layer.reference if ref else layer
    def f(x, h, w):
        y = fn(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w})
        return tg.math.sum(tg.math.multiply(y, c))
    return f

for name, g in relations():
    def run(name=name, g=g):
        x = rng.standard_normal((g.num_src, 2))
        h = rng.standard_normal((g.num_dst, 2))
        w = rng.uniform(0.5, 1.5, (g.num_edges, 1))
        c = rng.standard_normal((g.num_dst, 2))
        for red in ("sum", "mean", "max"):
            layer = Mixed(getattr(tg, red)())
            got = tg.grad(loss(layer, g, c, False), argnums=(0, 1, 2))(x, h, w)
            want = reference_grad(loss(layer, g, c, True), argnums=(0, 1, 2))(x, h, w)
            for what, a, b in zip(("src", "dst", "edge"), got, want):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9,
                                           atol=1e-10, err_msg=f"{name} {red} {what}")
    run.__name__ = f"grad_matches_reference_{name}"
    case(run)

@case
def stencil_grad_matches_finite_differences():
    g = tg.Graph.stencil((5, 6), [(0, 1), (-2, 1), (1, -1), (0, 0)])
    layer = Mixed(tg.max())
    w = rng.uniform(0.5, 1.5, (g.num_edges, 1))
    h = rng.standard_normal((g.num_dst, 1))
    c = rng.standard_normal((g.num_dst, 1))
    f = loss(layer, g, c, False)
    x = rng.standard_normal((g.num_src, 1))
    got = np.asarray(tg.grad(f)(x, h, w))
    eps, fd = 1e-6, np.zeros_like(x)
    for i in range(x.size):
        d = np.zeros_like(x)
        d.flat[i] = eps
        fd.flat[i] = (float(f(x + d, h, w)) - float(f(x - d, h, w))) / (2 * eps)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-7)

@case
def explain_names_the_native_transposed_walk():
    layer = Mixed(tg.sum())
    kinds = {"dense": tg.Graph.dense(20, 30), "triangular": tg.Graph.triangular(20),
             "segment": tg.Graph.cu_seqlens([0, 5, 20]),
             "stencil": tg.Graph.stencil((4, 5), [(0, 1), (1, 0)])}
    for traversal, g in kinds.items():
        x, h = np.ones((g.num_src, 2)), np.ones((g.num_dst, 2))
        w = np.ones((g.num_edges, 1))
        f = tg.jit(tg.grad(lambda x: tg.math.sum(layer(graph=g, src={"x": x},
                                                       dst={"h": h}, edge={"w": w}))))
        text = str(f.lower(x).compile().explain())
        line = [t for t in text.splitlines() if "grouped by src" in t]
        assert line and f'"transposed-{traversal}-row"' in line[0], text
        assert "materializes = []" in line[0] and "natively" in line[0], line[0]
        assert "transposed CSR" not in line[0] and "CSR of the implicit" not in text, text
        assert g._csr is None, f"{traversal}: the relation's CSR was built"
'''


def test_transposed_walks_match_the_reference():
    check_cases(GRADIENTS, env={"TIGA_NUM_THREADS": "4", "TIGA_STRICT": "1"}, timeout=300)


TRITON = '''
import tiga.lower.schedule as knobs
from tiga.lower.abi import relation_descriptor
from tiga.testing import reference_grad

tg.config.backend, tg.config.strict = "triton-interpreter", True
knobs.SPARSE_ROWS_MIN = 0     # (small relations take the sparse-source walk too)
rng = np.random.default_rng(11)

class Mixed(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.h * src.x

offs = [(0, 0), (1, 0), (-1, 2), (0, -3), (1, 0)]
RELATIONS = {
    "dense": (tg.Graph.dense(5, 7), ("dense_t",)),
    "triangular": (tg.Graph.triangular(6), ("triangular_t",)),
    "cu_causal": (tg.Graph.cu_seqlens([0, 3, 3, 7, 8], causal=True), ("cu_seqlens_t", True)),
    "cu_full": (tg.Graph.cu_seqlens([0, 3, 3, 7, 8], causal=False), ("cu_seqlens_t", False)),
    "stencil": (tg.Graph.stencil((4, 5), offs), "stencil_t"),
    "stencil_periodic": (tg.Graph.stencil((4, 5), offs, periodic=True), "stencil_t"),
    "sparse_sources": (tg.Graph.from_coo(rng.integers(0, 60, 8), rng.integers(0, 4, 8),
                                         num_src=60, num_dst=4), ("csr_rows",)),
}

for name, (g, walk) in RELATIONS.items():
    def run(name=name, g=g, walk=walk):
        got_walk = relation_descriptor(g, "src", target="triton")
        assert got_walk == walk or got_walk[0] == walk, got_walk
        x = rng.standard_normal((g.num_src, 2))
        h = rng.standard_normal((g.num_dst, 2))
        w = rng.uniform(0.5, 1.5, (g.num_edges, 1))
        c = rng.standard_normal((g.num_dst, 2))
        losses, got = {}, {}
        for red in ("max",):   # (its VJP walks by source with edge ids, as sum's does without)
            layer = Mixed(getattr(tg, red)())
            def loss(x, h, w, ref=False, layer=layer):
                fn = layer.reference if ref else layer
                y = fn(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w})
                return tg.math.sum(tg.math.multiply(y, c))
            losses[red] = loss
            got[red] = tg.grad(loss, argnums=(0, 1, 2))(x, h, w)
        # (checked before the reference runs: it resolves the CSR itself)
        if g.kind == "csr":
            assert g._transposed is None, "the num_src + 1 transposed row_ptr was built"
        else:
            assert g._csr is None, f"{name}: the relation's CSR was built"
        for red, loss in losses.items():
            want = reference_grad(lambda *a: loss(*a, ref=True), argnums=(0, 1, 2))(x, h, w)
            for what, a, b in zip(("src", "dst", "edge"), got[red], want):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9,
                                           atol=1e-10, err_msg=f"{name} {red} {what}")
    run.__name__ = f"triton_grad_matches_reference_{name}"
    case(run)
'''


def test_triton_transposed_walks_match_the_reference():
    check_cases(TRITON, env={"TRITON_INTERPRET": "1"}, timeout=400)
