"""Half-precision reducers on every route (issue 27 item 3, and item 7's bfloat16 on Triton).

float16 and bfloat16 messages accumulate in float32 and round once to their dtype at the end
(the rule in tiga/core/reducers.py). Each route (the reference interpreter, cpu-llvm, the
default route, Triton's interpreter) is compared with a float64 numpy oracle rounded once.
Documented tolerance, per output entry over a row of n messages x_i:

    |got - exact| <= ulp(exact) + n * 2**-24 * sum |x_i|

ulp(exact) is the spacing of the storage dtype at the exact value: rounding once costs at most
half of it, and float32 accumulation error (the second term) may carry the sum across one more
rounding boundary. Accumulating in the storage dtype misses this by orders of magnitude (the
mean of 100,000 halves of 0.5 was 0.01024; a bfloat16 sum of 1000 ones was 256).
max and min are exact. Each group runs in one subprocess (see _run.py).
"""
from __future__ import annotations

from ._run import check_cases

COMMON = '''
import ml_dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16}
BITS = {"float16": 11, "bfloat16": 8}    # significand bits, the implicit one included
# (route, dtype, strict): cpu-llvm compiles float16 only; bfloat16 takes the default route
ROUTES = [("reference", "float16", False), ("reference", "bfloat16", False),
          ("cpu-llvm", "float16", True), ("default", "bfloat16", False),
          ("triton-interpreter", "float16", True), ("triton-interpreter", "bfloat16", True)]

def ulp(x, name):
    """Spacing of the dtype `name` at x (float64 arithmetic)."""
    _, e = np.frexp(np.abs(np.asarray(x, np.float64)))
    return np.ldexp(1.0, e - BITS[name])

def within(got, exact, n, absum, name, what):
    """got has the storage dtype and lies within the module's documented tolerance."""
    got = np.asarray(got)
    assert got.dtype == DTYPES[name], f"{what}: dtype {got.dtype}, expected {name}"
    got = got.astype(np.float64)
    bound = ulp(exact, name) + np.asarray(n, np.float64) * 2.0 ** -24 * absum
    err = np.abs(got - exact)
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: error {err[bad][:4]} over the bound {bound[bad][:4]} "
                           f"(got {got[bad][:4]}, exact {exact[bad][:4]})")

def on(route, strict, fn):
    """fn() on one route: the reference interpreter, or a backend (strict: no fallback)."""
    if route == "reference":
        return fn(reference=True)
    old = tg.config._backend, tg.config.strict
    if route != "default":
        tg.config.backend = route
    tg.config.strict = strict
    try:
        return fn(reference=False)
    finally:
        tg.config.backend, tg.config.strict = old

class Layer(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        if self.reducer.name == "online_softmax":
            return self.reducer(edge.s, src.x)
        return src.x

def call(reducer, g, x, s=None):
    m = Layer(reducer)
    kw = dict(graph=g, src={"x": x}, dst={}, edge={} if s is None else {"s": s})
    return lambda reference: (m.reference if reference else m)(**kw)

# rows of 1200, 200, 33, 1 and 0 edges over 64 sources: long rows are where accumulating
# in the storage dtype goes wrong (kept short: Triton's interpreter takes ~1 ms per edge)
rng = np.random.default_rng(27)
DEG = np.array([1200, 200, 33, 1, 0])
G = tg.Graph.from_csr(np.concatenate([[0], np.cumsum(DEG)]),
                      rng.integers(0, 64, DEG.sum()), num_src=64)
ROW_PTR, COL = G.resolve_csr()

def rows64(values):
    """Per row, the float64 messages (values indexed by edge source)."""
    return [values[COL[a:b]].astype(np.float64) for a, b in zip(ROW_PTR[:-1], ROW_PTR[1:])]

def per_row(fn, rows, tail):
    return np.stack([fn(r) if len(r) else np.zeros(tail) for r in rows])

def exact_and_bound_terms(name, rows, tail):
    """(float64 exact result, n, sum |terms|) per row for sum / mean / prod."""
    n = DEG.reshape(-1, *([1] * len(tail)))
    if name == "sum":
        return per_row(lambda r: r.sum(0), rows, tail), n, \\
            per_row(lambda r: np.abs(r).sum(0), rows, tail)
    if name == "mean":
        return per_row(lambda r: r.mean(0), rows, tail), n, \\
            per_row(lambda r: np.abs(r).mean(0), rows, tail)
    exact = np.stack([r.prod(0) if len(r) else np.ones(tail) for r in rows])
    return exact, n, np.abs(exact)   # relative error: n roundings of one float32 product
'''

SUM_MEAN_PROD = COMMON + '''
def check_reducer(name, make, low, high):
    for route, dname, strict in ROUTES:
        x = rng.uniform(low, high, (64, 2)).astype(DTYPES[dname])
        got = on(route, strict, call(make(), G, x))
        exact, n, absum = exact_and_bound_terms(name, rows64(x), (2,))
        within(got, exact, n, absum, dname, f"{name} on {route} ({dname})")

@case
def sum_of_long_rows():
    check_reducer("sum", tg.sum, 0.5, 1.5)

@case
def sum_with_cancellation():
    check_reducer("sum", tg.sum, -1.0, 1.0)

@case
def mean_of_long_rows():
    check_reducer("mean", tg.mean, 0.5, 1.5)

@case
def prod_of_long_rows():
    # factors within 2**-9 of 1: the product over 1200 edges stays in range
    check_reducer("prod", tg.prod, 1 - 2 ** -9, 1 + 2 ** -9)

@case
def max_and_min_are_exact():
    for route, dname, strict in ROUTES:
        x = rng.standard_normal((64, 2)).astype(DTYPES[dname])
        for name in ("max", "min"):
            got = np.asarray(on(route, strict, call(getattr(tg, name)(), G, x)))
            fn = np.max if name == "max" else np.min
            exact = per_row(lambda r: fn(r, 0), rows64(x), (2,))
            assert got.dtype == DTYPES[dname], got.dtype
            np.testing.assert_array_equal(got.astype(np.float64), exact,
                                          err_msg=f"{name} on {route} ({dname})")
'''

THE_ISSUE_CASES = COMMON + '''
@case
def mean_of_100000_halves():
    for route, dname, strict in ROUTES:
        # Triton's interpreter takes a minute over 100,000 edges: 5,000 also stall a sum
        # kept in either half dtype (at 1024 for float16, 256 for bfloat16)
        n = 5_000 if route.startswith("triton") else 100_000
        one_row = tg.Graph.from_csr(np.array([0, n]), np.zeros(n, np.int64), num_src=1)
        x = np.full((1, 1), 0.5, DTYPES[dname])
        got = np.asarray(on(route, strict, call(tg.mean(), one_row, x)))
        assert got.dtype == DTYPES[dname] and float(got[0, 0]) == 0.5, (route, dname, got)

@case
def sum_of_1000_ones():
    n = 1000
    one_row = tg.Graph.from_csr(np.array([0, n]), np.arange(n) % 7, num_src=7)
    for route, dname, strict in ROUTES:
        x = np.ones((7, 1), DTYPES[dname])
        got = np.asarray(on(route, strict, call(tg.sum(), one_row, x)))
        assert got.dtype == DTYPES[dname] and float(got[0, 0]) == 1000.0, (route, dname, got)

@case
def online_softmax_of_long_rows():
    for route, dname, strict in ROUTES:
        x = rng.uniform(-1, 1, (64, 2)).astype(DTYPES[dname])
        s = rng.uniform(-2, 2, (G.num_edges,)).astype(DTYPES[dname])
        got = on(route, strict, call(tg.online_softmax(), G, x, s))
        exact = np.zeros((len(DEG), 2))
        for r, (a, b) in enumerate(zip(ROW_PTR[:-1], ROW_PTR[1:])):
            if b > a:
                p = np.exp(s[a:b].astype(np.float64))
                exact[r] = (p[:, None] * x[COL[a:b]].astype(np.float64)).sum(0) / p.sum()
        # weights are float32 exps: one more ulp of float32 per term on top of the sums'
        within(got, exact, 2 * DEG[:, None], np.abs(x).max(), dname,
               f"online_softmax on {route} ({dname})")

@case
def gradient_fan_out():
    """Sources feeding ~20 edges each, whose cotangents the transposed propagate of the VJP
    sums (it follows the same rule)."""
    from tiga.autodiff.vjp import vjp_program
    from tiga.core.eval import eval_program

    def f(x):
        return Layer(tg.sum())(graph=G, src={"x": x}, dst={})

    for route, dname, strict in ROUTES:
        if route == "triton-interpreter":
            continue   # its VJP route is covered by tests/lower/test_nonfinite_differential.py
        x = rng.uniform(0.5, 1.5, (64, 2)).astype(DTYPES[dname])
        ct = rng.uniform(0.5, 1.5, (len(DEG), 2)).astype(DTYPES[dname])
        if route == "reference":
            got = eval_program(vjp_program(tg.make_program(f)(x), [True]), x, ct)[1]
        else:
            got = on(route, strict, lambda reference: tg.vjp(f, x)[1](ct))
        got = got[0] if isinstance(got, (tuple, list)) else got
        exact = np.zeros((64, 2))
        np.add.at(exact, COL, np.repeat(ct.astype(np.float64), DEG, axis=0))
        n = np.bincount(COL, minlength=64)[:, None]
        within(got, exact, n, exact, dname, f"d/dx on {route} ({dname})")
'''

ENV = {"TRITON_INTERPRET": "1"}


def test_sum_mean_prod_max_min_match_the_rounded_float64_oracle():
    check_cases(SUM_MEAN_PROD, env=ENV, timeout=240)


def test_the_issue_cases_softmax_and_gradients():
    check_cases(THE_ISSUE_CASES, env=ENV, timeout=240)
