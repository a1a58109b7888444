"""Finite-difference checks (float64) of every VJP rule in tiga.autodiff.vjp_rules.

Each case builds a small function whose traced program applies the primitive under test at the
top level, differentiates it with tg.vjp against a random cotangent, and compares the result
with central finite differences of <cotangent, f(x)>. The forward values come from Tiga's own
reference interpreter; the oracle is the finite-difference quotient, independent of the rules.
A coverage test makes adding a differentiable primitive without a case here fail.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import tiga as tg
from tiga.autodiff import NONDIFF, vjp_rules
from tiga.core.primitive import all_primitives
from tiga.core.prims.control import repeat_p
from tiga.core.prims.graph import map_rows_p, propagate_p, row_type
from tiga.core.prims.shape import broadcast_in_dim_p
from tiga.core.program import ClosedProgram
from tiga.trace.pytree import tree_flatten, tree_unflatten
from tiga.trace.staging import trace_flat
from tiga.trace.tracer import aval_of, bind

m = tg.math


# ---- the one generic finite-difference helper ---------------------------------------------


def _fd_loss(fn: Callable, cts: list) -> Callable:
    """<cts, fn(*xs)> as a plain float; the oracle the VJP is compared against."""
    def loss(*xs):
        leaves, _ = tree_flatten(fn(*xs))
        return sum(float(np.sum(c * np.asarray(v, np.float64))) for c, v in zip(cts, leaves))
    return loss


def check_vjp(fn: Callable, xs: list, *, seed: int = 0, fd_fn: Callable | None = None,
              eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-6) -> list:
    """Compare tg.vjp(fn, *xs) with central differences of <ct, fd_fn(*xs)> for a random ct.

    `fd_fn` defaults to tg.jit(fn) (traced once, then the reference interpreter per point);
    a different oracle is given where the VJP deliberately differs from the naive derivative
    (stop_gradient) or must be independent of the transformation under test (second order).
    """
    rng = np.random.default_rng(seed)
    xs = [np.asarray(x) for x in xs]
    out, vjp_fn = tg.vjp(fn, *xs)
    leaves, tree = tree_flatten(out)
    cts = [rng.standard_normal(np.shape(v)) for v in leaves]
    grads = vjp_fn(tree_unflatten(tree, [c.astype(np.asarray(v).dtype) for c, v in
                                         zip(cts, leaves)]))
    assert len(grads) == len(xs)
    loss = _fd_loss(fd_fn or tg.jit(fn), cts)
    for i, (x, g) in enumerate(zip(xs, grads)):
        g = np.asarray(g)
        assert g.shape == x.shape, f"cotangent of input {i}: shape {g.shape} != {x.shape}"
        assert g.dtype == x.dtype, f"cotangent of input {i}: dtype {g.dtype} != {x.dtype}"
        fd = np.zeros(x.shape, np.float64)
        for idx in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in xs], [a.copy() for a in xs]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            fd[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol,
                                   err_msg=f"VJP of input {i} differs from finite differences")
    return grads


def top_level_primitives(fn: Callable, xs: list) -> set:
    program = tg.make_program(fn)(*xs)
    return {e.primitive.name for e in program.eqns}


# ---- cases -----------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    prims: tuple  # primitives whose VJP rule the case exercises (top-level equations)
    fn: Callable
    make_inputs: Callable  # rng -> list of float64 arrays
    fd_fn: Callable | None = None
    eps: float = 1e-6
    tol: float = 1e-5

    def inputs(self):
        return self.make_inputs(np.random.default_rng(zlib.crc32(self.id.encode())))


def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def positive(*shape, lo=0.5, hi=2.0):
    return lambda rng: rng.uniform(lo, hi, shape)


def away_from_zero(*shape):
    """Magnitudes in [0.3, 1.5] with random signs: no kink of abs/sign nearby."""
    return lambda rng: rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def several(*makers):
    return lambda rng: [mk(rng) for mk in makers]


def distinct_pair(*shape):
    """x, y with |x - y| >= 0.2 everywhere, so max/min stay away from their kink."""
    def make(rng):
        x = rng.standard_normal(shape)
        gap = rng.uniform(0.2, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
        return [x, x + gap]
    return make


CASES: list[Case] = []


def case(id, prims, fn, make_inputs, **kw):
    CASES.append(Case(id, tuple(prims), fn, make_inputs, **kw))


# elementwise unary: inputs inside each function's smooth domain
for _name, _fn, _make in [
        ("neg", m.negative, normal(2, 3)),
        ("exp", m.exp, normal(2, 3)),
        ("log", m.log, positive(2, 3)),
        ("log1p", m.log1p, positive(2, 3, lo=0.0, hi=1.0)),
        ("expm1", m.expm1, normal(2, 3)),
        ("sqrt", m.sqrt, positive(2, 3)),
        ("rsqrt", m.rsqrt, positive(2, 3)),
        ("abs", m.abs, away_from_zero(2, 3)),
        ("tanh", m.tanh, normal(2, 3)),
        ("logistic", m.sigmoid, normal(2, 3)),
        ("erf", m.erf, normal(2, 3)),
        ("sin", m.sin, normal(2, 3)),
        ("cos", m.cos, normal(2, 3))]:
    case(_name, [_name], _fn, several(_make))

# elementwise binary
case("add", ["add"], m.add, several(normal(2, 3), normal(2, 3)))
case("sub", ["sub"], m.subtract, several(normal(2, 3), normal(2, 3)))
case("mul", ["mul"], m.multiply, several(normal(2, 3), normal(2, 3)))
case("div", ["div"], m.divide, several(normal(2, 3), away_from_zero(2, 3)))
case("pow", ["pow"], m.power, several(positive(2, 3), normal(2, 3)))
case("pow-python-exponent", ["pow"], lambda x: x ** 2.5, several(positive(2, 3)))
case("pow-python-base", ["pow"], lambda y: 1.7 ** y, several(normal(2, 3)))
case("max", ["max"], m.maximum, distinct_pair(2, 3))
case("min", ["min"], m.minimum, distinct_pair(2, 3))
# at an exact tie the rule splits the cotangent evenly; so does the central difference
case("max-ties", ["max"], m.maximum, lambda rng: [np.arange(6.0).reshape(2, 3)] * 2)
case("min-ties", ["min"], m.minimum, lambda rng: [np.arange(6.0).reshape(2, 3)] * 2)
# a rank-0 operand broadcasts inside the primitive: its cotangent sums over the result
case("mul-rank0", ["mul"], m.multiply, several(normal(2, 3), normal()))
case("div-rank0", ["div"], lambda s, y: s / y, several(normal(), away_from_zero(2, 3)))
case("max-rank0", ["max"], lambda x, s: m.maximum(x, s),
     lambda rng: [np.array([[-1.0, 0.5, 2.0], [1.5, -0.3, 0.9]]), np.array(0.2)])

_MASK = np.array([[True, False, True], [False, False, True]])
case("select", ["select"], lambda x, y: m.where(_MASK, x, y),
     several(normal(2, 3), normal(2, 3)))
case("select-rank0", ["select"], lambda x, s: m.where(_MASK, s, x),
     several(normal(2, 3), normal()))
# float32 round-off dominates tiny steps, so this case uses a larger step and tolerance
case("convert", ["convert"],
     lambda x: m.exp(x.astype(tg.float32)).astype(tg.float64) * x,
     several(normal(2, 3)), eps=1e-2, tol=2e-3)

# stop_gradient: the oracle treats the stopped value as the constant it is at the primal
_SG_AT = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
case("stop_gradient", ["stop_gradient"], lambda x: m.sin(x) * m.stop_gradient(x),
     lambda rng: [_SG_AT.copy()], fd_fn=lambda x: m.sin(x) * _SG_AT)

# reductions
case("reduce_sum-axes", ["reduce_sum"], lambda x: m.sum(x, axis=(0, 2)), several(normal(2, 3, 2)))
case("reduce_sum-keepdims", ["reduce_sum"], lambda x: m.sum(x, axis=1, keepdims=True) * x,
     several(normal(2, 3)))
case("reduce_max", ["reduce_max"], lambda x: m.max(x, axis=1), several(normal(3, 4)))
case("reduce_min", ["reduce_min"], lambda x: m.min(x, axis=(0, 2)), several(normal(3, 2, 2)))
# two-way ties: the rule shares the cotangent between the tied entries, as does the quotient
case("reduce_max-ties", ["reduce_max"], lambda x: m.max(x, axis=1),
     lambda rng: [np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 0.5, -2.0, 2.0]])])
case("reduce_prod", ["reduce_prod"], lambda x: m.prod(x, axis=1), several(normal(3, 4)))
# rows with no, one and two zeros: prod is multilinear, so the quotient is exact there
case("reduce_prod-zeros", ["reduce_prod"], lambda x: m.prod(x, axis=1),
     lambda rng: [np.array([[0.5, -1.2, 2.0, 0.7], [1.3, 0.0, -0.8, 1.1],
                            [0.0, 2.0, 0.0, -1.5]])])

# dot_general with several dimension numbers
for _id, _dims, _xs, _ys in [
        ("matmul", (((1,), (0,)), ((), ())), (2, 3), (3, 4)),
        ("vector-dot", (((0,), (0,)), ((), ())), (3,), (3,)),
        ("outer", (((), ()), ((), ())), (2,), (3,)),
        ("batched", (((2,), (1,)), ((0,), (0,))), (2, 3, 4), (2, 4, 2)),
        ("multi-contract", (((1, 2), (1, 0)), ((), ())), (2, 3, 4), (4, 3, 2)),
        ("batch-middle", (((2,), (0,)), ((1,), (1,))), (3, 2, 4), (4, 2, 2)),
        ("contract-first", (((0,), (1,)), ((), ())), (3, 2), (2, 3, 2)),
        ("two-batch", (((3,), (2,)), ((0, 2), (1, 0))), (2, 2, 3, 2), (3, 2, 2, 2))]:
    case(f"dot_general-{_id}", ["dot_general"],
         (lambda d: lambda x, y: m.dot_general(x, y, d))(_dims),
         several(normal(*_xs), normal(*_ys)))
case("dot_general-matmul-op", ["dot_general"], lambda x, y: x @ y,
     several(normal(2, 2, 3), normal(3, 2)))

# shape primitives
case("broadcast_in_dim-leading", ["broadcast_in_dim"], lambda x: m.broadcast_to(x, (2, 3)) * 1.5,
     several(normal(3)))
case("broadcast_in_dim-stretch", ["broadcast_in_dim"], lambda x: m.broadcast_to(x, (2, 3, 4)),
     several(normal(3, 1)))
case("broadcast_in_dim-rank0", ["broadcast_in_dim"], lambda x: m.broadcast_to(x, (2, 2)),
     several(normal()))
case("broadcast_in_dim-inner", ["broadcast_in_dim"],
     lambda x: bind(broadcast_in_dim_p, x, shape=(3, 2, 4), broadcast_dimensions=(0, 2)),
     several(normal(3, 1)))
case("reshape", ["reshape"], lambda x: m.reshape(x, (3, 4)), several(normal(2, 3, 2)))
case("transpose", ["transpose"], lambda x: m.transpose(x, (2, 0, 1)), several(normal(2, 3, 4)))
case("slice-strided", ["slice"], lambda x: x[1:5:2, ::3], several(normal(5, 7)))
case("slice-int-index", ["slice"], lambda x: x[1, 1:], several(normal(3, 4)))
case("pad-interior", ["pad"], lambda x: m.pad(x, [(1, 0, 1), (2, 1, 2)]), several(normal(2, 3)))
case("pad-edges", ["pad"], lambda x: m.pad(x, [(0, 2, 0), (1, 0, 0)]) ** 2,
     several(normal(2, 2)))
case("concatenate", ["concatenate"], lambda x, y, z: m.concatenate([x, y, z], axis=1),
     several(normal(2, 1), normal(2, 3), normal(2, 2)))
case("concatenate-stack", ["concatenate"], lambda x, y: m.stack([x, y], axis=0),
     several(normal(2, 3), normal(2, 3)))


# ---- propagate ---------------------------------------------------------------------------------

# Edges (src, dst) in user order, deliberately not sorted by destination (so the stored edge
# permutation matters): destinations 1 and 3 are empty, (1, 2) is duplicated, (2, 2) is a
# self edge in id terms. Sources: 0 -> {0, 4, 2}, 1 -> {2, 2}, 2 -> {2, 0}, 3 -> {4}.
EDGES = [(2, 2), (0, 0), (1, 2), (3, 4), (1, 2), (0, 4), (2, 0), (0, 2)]
NUM_SRC, NUM_DST, NUM_EDGES = 4, 5, len(EDGES)
GRAPH = tg.Graph.from_coo(np.array([s for s, _ in EDGES]), np.array([d for _, d in EDGES]),
                          num_src=NUM_SRC, num_dst=NUM_DST)
# zero messages for prod: destination 0 gets one (edge 6), destination 2 two (edges 2 and 4)
ZERO_EDGES = [2, 4, 6]


def _fields(rng, feat=2):
    x = rng.standard_normal((NUM_SRC, feat))
    h = rng.standard_normal((NUM_DST, feat))
    w = rng.uniform(0.5, 1.5, NUM_EDGES) * rng.choice([-1.0, 1.0], NUM_EDGES)
    return [x, h, w, np.array(rng.uniform(0.5, 1.5))]


def _fields_with_zeros(rng):
    x, h, w, s = _fields(rng)
    w[ZERO_EDGES] = 0.0
    return [x, h, w, s]


def _message(src, dst, edge, scale):
    """Reads every role; the edge term keeps messages into one destination distinct."""
    return m.tanh(src.x * scale + dst.h) * edge.w + edge.w


def _scaled_message(src, dst, edge, scale):
    """Exactly zero wherever edge.w is zero (for prod's zero handling)."""
    return edge.w * m.tanh(src.x * scale + dst.h)


def _functional(reducer, edge_fn=_message):
    def f(x, h, w, s):
        return tg.propagate(GRAPH, edge_fn, reducer, src={"x": x}, dst={"h": h},
                            edge={"w": w}, scale=s)
    return f


for _name, _red in [("sum", tg.sum), ("mean", tg.mean), ("max", tg.max), ("min", tg.min),
                    ("prod", tg.prod)]:
    case(f"propagate-{_name}", ["propagate"], _functional(_red()), _fields)
case("propagate-prod-zeros", ["propagate"], _functional(tg.prod(), _scaled_message),
     _fields_with_zeros)


def _two_messages(src, dst, edge, scale):
    return _message(src, dst, edge, scale), m.sin(src.x * edge.w) * scale - dst.h


case("propagate-max-two-outputs", ["propagate"], _functional(tg.max(), _two_messages), _fields)
case("propagate-sum-two-outputs", ["propagate"], _functional(tg.sum(), _two_messages), _fields)

HEADS, FEAT = 2, 2
_SOFTMAX = tg.online_softmax()


def _attention_fields(rng):
    k = rng.standard_normal((NUM_SRC, HEADS, FEAT))
    v = rng.standard_normal((NUM_SRC, HEADS, FEAT))
    q = rng.standard_normal((NUM_DST, HEADS, FEAT))
    b = rng.standard_normal((NUM_EDGES, HEADS))
    return [k, v, q, b, np.array(0.8)]


def _attention_edge(src, dst, edge, scale):
    score = m.sum(src.k * dst.q, axis=-1) * scale + edge.b  # one score per head
    return _SOFTMAX(score, src.v + dst.q)


class Attention(tg.MessagePassing):
    reducer = _SOFTMAX

    def edge(self, src, dst, edge, scale):
        return _attention_edge(src, dst, edge, scale)


case("propagate-online_softmax-multihead", ["propagate"],
     lambda k, v, q, b, s: Attention()(graph=GRAPH, src={"k": k, "v": v}, dst={"q": q},
                                       edge={"b": b}, scale=s),
     _attention_fields)


class GatedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, scale):
        return _message(src, dst, edge, scale)

    def update(self, dst, aggregated, scale):
        return m.tanh(aggregated) * dst.h + scale * aggregated


class GatedMax(GatedSum):
    reducer = tg.max()


for _name, _cls in [("sum", GatedSum), ("max", GatedMax)]:
    case(f"propagate-{_name}-update", ["propagate"],
         (lambda c: lambda x, h, w, s: c()(graph=GRAPH, src={"x": x}, dst={"h": h},
                                           edge={"w": w}, scale=s))(_cls),
         _fields)


def _closed(fn, in_types) -> ClosedProgram:
    prog, caps, _ = trace_flat(fn, in_types, top=False)
    assert not caps
    return ClosedProgram(prog)


def _row_types(values, roles):
    return [aval_of(v).strong() if r == "param" else row_type(aval_of(v))
            for v, r in zip(values, roles)]


def direct_propagate(reducer, reduce_by, edge_fn):
    """A function binding propagate_p itself (reduce_by values the public API does not reach).

    edge_fn(x_row, h_row, w_row, s) -> message parts; fields are (src x, dst h, edge w, s).
    """
    roles = ("src", "dst", "edge", "param")

    def f(*values):
        prog = _closed(edge_fn, _row_types(values, roles))
        outs = bind(propagate_p, GRAPH, *values, edge_fn=prog, reducer=reducer, roles=roles,
                    names=("x", "h", "w", "s"), reduce_by=reduce_by, update=None)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return f


def _row_message(x, h, w, s):
    return m.tanh(x * s + h) * w + w


def _row_scaled(x, h, w, s):
    return w * m.tanh(x * s + h)


def _row_attention(x, h, w, s):
    score = x * s + w  # one score per feature: value rows start with the score shape
    return score, m.sin(x) + h


for _by, _name, _red, _efn, _make in [
        ("src", "sum", tg.sum, _row_message, _fields),
        ("src", "mean", tg.mean, _row_message, _fields),
        ("src", "max", tg.max, _row_message, _fields),
        ("src", "min", tg.min, _row_message, _fields),
        ("src", "prod", tg.prod, _row_scaled, _fields_with_zeros),
        ("src", "online_softmax", tg.online_softmax, _row_attention, _fields),
        ("all", "sum", tg.sum, _row_message, _fields),
        ("all", "mean", tg.mean, _row_message, _fields),
        ("all", "max", tg.max, _row_message, _fields),
        ("all", "prod", tg.prod, _row_message, _fields),
        ("all", "online_softmax", tg.online_softmax, _row_attention, _fields),
        ("edge", "sum", tg.sum, _row_message, _fields),
        ("edge", "max", tg.max, _row_message, _fields)]:
    case(f"propagate-by-{_by}-{_name}", ["propagate"], direct_propagate(_red(), _by, _efn),
         _make)


# ---- map_rows and repeat ----------------------------------------------------------------------


def _map_rows(x, p):
    fn = _closed(lambda row, q: m.sin(row) * q + m.sum(row * row), [row_type(aval_of(x)),
                                                                    aval_of(p).strong()])
    (out,) = bind(map_rows_p, x, p, fn=fn, batched=(True, False))
    return out


case("map_rows", ["map_rows"], _map_rows, several(normal(4, 3), normal(3)))


def _repeat(w, b, h):
    def body(state):
        h, acc = state
        return m.tanh(h @ w + b), acc + m.sum(h * h)
    return tg.repeat(3, body, (h, m.sum(h) * 0.0))


case("repeat", ["repeat"], _repeat, several(lambda r: 0.5 * r.standard_normal((3, 3)),
                                               normal(3), normal(2, 3)))


def _repeat_xs(reverse):
    """repeat with a const, a carry, a per-step input and a stacked output (direct bind)."""
    def f(c, s, xs):
        body = _closed(lambda c, s, x: (m.tanh(s * c + x), s * m.sin(x)),
                       [aval_of(c), aval_of(s), row_type(aval_of(xs))])
        carry, ys = bind(repeat_p, c, s, xs, body=body, length=3, num_consts=1, num_carry=1,
                         reverse=reverse)
        return carry, ys
    return f


case("repeat-xs", ["repeat"], _repeat_xs(False), several(normal(2), normal(2), normal(3, 2)))
case("repeat-xs-reverse", ["repeat"], _repeat_xs(True), several(normal(2), normal(2), normal(3, 2)))


def _cond(pick: float):
    """tg.cond whose predicate reads x (no gradient through it); the true branch also
    closes over y, so the branches' captured operands get cotangents too."""
    def f(x, y):
        pred = m.sum(x) * 0.0 + pick > 0.5
        return tg.cond(pred, lambda a: (m.sin(a) * y, a * 2.0), lambda a: (a * a, m.exp(a)), x)
    return f


case("cond-true", ["cond"], _cond(1.0), several(normal(3), normal(3)))
case("cond-false", ["cond"], _cond(0.0), several(normal(3), normal(3)))


def _switch(x, y):
    branches = [lambda a, b: a * b, lambda a, b: m.tanh(a) + b * b, lambda a, b: a - b]
    return tg.switch(np.int32(7), branches, x, y)     # clamped: the last branch


case("switch-clamped", ["cond"], _switch, several(normal(2, 2), normal(2, 2)))


# ---- custom rules (tg.custom_vjp / tg.custom_jvp): here each rule is the true derivative ------


@tg.custom_vjp
def _custom_sin(x, y):
    return m.sin(x) * y


_custom_sin.defvjp(lambda x, y: (_custom_sin(x, y), (x, y)),
                   lambda res, ct: (ct * m.cos(res[0]) * res[1], ct * m.sin(res[0])))


@tg.custom_jvp
def _custom_tanh(x):
    return m.tanh(x)


_custom_tanh.defjvp(lambda p, t: (_custom_tanh(p[0]), t[0] * (1 - m.tanh(p[0]) ** 2)))

case("custom_vjp_call", ["custom_vjp_call"], _custom_sin, several(normal(2, 3), normal(2, 3)))
case("custom_jvp_call", ["custom_jvp_call"], lambda x: _custom_tanh(x) * x,
     several(normal(2, 3)))


# ---- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_vjp_matches_finite_differences(c: Case):
    xs = c.inputs()
    assert set(c.prims) <= top_level_primitives(c.fn, xs), \
        f"case {c.id} does not apply {c.prims} at the top level"
    check_vjp(c.fn, xs, seed=zlib.crc32(c.id.encode()), fd_fn=c.fd_fn, eps=c.eps,
              rtol=c.tol, atol=c.tol)


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_every_differentiable_primitive_has_a_finite_difference_case():
    covered = {p for c in CASES for p in c.prims}
    # while_loop's rule is an explicit error, checked by test_while_loop_vjp_names_repeat
    covered.add("while_loop")
    missing = [p.name for p in all_primitives()
               if vjp_rules.get(p) is not NONDIFF and p.name not in covered]
    assert not missing, f"differentiable primitives without a finite-difference case: {missing}"
    stale = covered - {p.name for p in all_primitives()}
    assert not stale, f"cases name unknown primitives: {stale}"


def test_nondiff_primitives_give_zero_gradients():
    """Comparisons, sign, floor, ... are NONDIFF: gradients flowing only through them vanish."""
    x = np.array([-1.3, 0.4, 2.2])

    def f(x):
        picked = m.where(x > 0.0, 1.0, -1.0) + m.floor(x) + m.sign(x) + m.ceil(x)
        return m.sum(picked * 2.0)

    np.testing.assert_array_equal(np.asarray(tg.grad(f)(x)), np.zeros(3))


# ---- reducer conventions the quotient cannot see ------------------------------------------------


@pytest.mark.parametrize("name", ["max", "min"])
def test_propagate_extremum_routes_ties_to_first_edge(name):
    """API.md: max/min send the cotangent to the first extremal edge in edge order."""
    # ties everywhere: destination 0 (edges 1, 6), 2 (edges 2, 4, 7 after edge 0), 4 (3, 5)
    w = np.array([1.0, 2.0, 3.0, 0.5, 3.0, 0.5, 2.0, 3.0])
    w = w if name == "max" else -w
    reducer = tg.max() if name == "max" else tg.min()

    def f(w):
        return tg.propagate(GRAPH, lambda src, dst, edge: edge.w, reducer, edge={"w": w})

    ct = np.arange(1.0, NUM_DST + 1)
    _, vjp_fn = tg.vjp(f, w)
    (got,) = vjp_fn(ct)
    want = np.zeros(NUM_EDGES)
    pick = max if name == "max" else min
    for d in range(NUM_DST):  # plain-Python oracle of the documented convention
        edges = [e for e, (_, dd) in enumerate(EDGES) if dd == d]
        if edges:
            best = pick(w[e] for e in edges)
            want[next(e for e in edges if w[e] == best)] += ct[d]
    assert np.count_nonzero(want) == 3
    np.testing.assert_array_equal(np.asarray(got), want)


def test_grad_through_user_reducer_is_unsupported():
    red = tg.Reducer("mysum", 0.0, combine=lambda a, b: a + b)

    def f(x):
        return tg.propagate(GRAPH, lambda src, dst, edge: src.x, red, src={"x": x}).sum()

    x = np.ones((NUM_SRC, 2))
    np.testing.assert_allclose(np.asarray(tg.jit(f)(x)), NUM_EDGES * 2.0)
    with pytest.raises(tg.UnsupportedError, match="mysum"):
        tg.grad(f)(x)


# ---- errors ------------------------------------------------------------------------------------


def test_while_loop_vjp_names_repeat():
    def f(x):
        out = tg.while_loop(lambda s: m.sum(s) < 10.0, lambda s: s * 2.0, x, max_iterations=5)
        return m.sum(out)

    x = np.array([0.5, 1.0])
    np.testing.assert_allclose(float(tg.jit(f)(x)), 12.0)  # forward still runs
    with pytest.raises(tg.UnsupportedError, match=r"tg\.repeat") as info:
        tg.grad(f)(x)
    assert "while_loop" in str(info.value)


def test_grad_of_integer_input_is_a_dtype_error():
    with pytest.raises(tg.DTypeError, match=r"argument 1: .*floating.*i64"):
        tg.grad(lambda x, n: m.sum(x * n), argnums=1)(np.ones(3), np.arange(3))
    with pytest.raises(tg.DTypeError, match=r"argument 0"):
        tg.grad(lambda n: m.sum(n * 1.5))(np.arange(3, dtype=np.int32))


# ---- second order --------------------------------------------------------------------------------


def test_grad_of_grad_elementwise():
    def f(x):
        return m.sum(m.sin(x) * x ** 3 + m.exp(x * 0.5) / (1.0 + x * x))

    first = tg.grad(f)
    x = np.random.default_rng(1).standard_normal(5)
    # the oracle differentiates the concrete first gradient numerically
    check_vjp(first, [x], seed=2, fd_fn=first, rtol=1e-5, atol=1e-6)


def test_grad_of_grad_sum_propagate():
    def f(x, w):
        y = tg.propagate(GRAPH, lambda src, dst, edge: m.tanh(src.x * edge.w), tg.sum(),
                         src={"x": x}, edge={"w": w})
        return m.sum(y * y * y)

    first = tg.grad(f, argnums=(0, 1))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((NUM_SRC, 2)), rng.standard_normal(NUM_EDGES)]
    check_vjp(first, xs, seed=4, fd_fn=first, rtol=1e-5, atol=1e-6)
