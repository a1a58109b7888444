"""Hostile edge functions and reducers: no return, numpy calls on tracers, malformed user
reducers, Python control flow on traced values (issue 13). One subprocess per group."""
from __future__ import annotations

from ._run import check_cases

COMMON = '''
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
x = np.array([2.0, 3.0])
xs = np.array([[2.0, -1.0], [3.0, 0.5]])

def run(fn, reducer=None, field=x, **kw):
    return tg.propagate(g, fn, tg.sum() if reducer is None else reducer, src={"x": field}, **kw)
'''


MALFORMED_EDGE_FUNCTIONS = COMMON + '''
@case
def no_return():
    def message(src, dst, edge):
        src.x * 2.0
    raises(tg.TraceError, lambda: run(message), "edge function", "message: returned None",
           "is a `return` missing?")

@case
def no_return_in_a_subclass():
    class Forgetful(tg.MessagePassing):
        reducer = tg.sum()
        def edge(self, src, dst, edge):
            src.x
    raises(tg.TraceError, lambda: Forgetful()(graph=g, src={"x": x}),
           "edge function Forgetful.edge: returned None")

@case
def returns_a_string():
    raises(tg.TraceError, lambda: run(lambda s, d, e: "msg"), "returned a str")

@case
def not_callable():
    raises(tg.TigaError, lambda: tg.propagate(g, 3, tg.sum(), src={"x": x}),
           "edge function: expected a callable")

@case
def reducer_not_a_reducer():
    raises(tg.TigaError, lambda: tg.propagate(g, lambda s, d, e: s.x, "sum", src={"x": x}),
           "reducer: expected a tg.Reducer")

@case
def python_if_on_a_traced_value():
    def branchy(src, dst, edge):
        return src.x if src.x > 0 else -src.x
    raises(tg.TraceError, lambda: run(branchy), "no concrete truth value", "tg.math.where")

@case
def float_of_a_traced_value():
    raises(tg.TraceError, lambda: run(lambda s, d, e: s.x * float(s.x)),
           "float() of the traced value", "no concrete value")

@case
def iterating_a_scalar_row():
    raises(tg.ShapeError, lambda: run(lambda s, d, e: sum(v for v in s.x)), "too many entries")

@case
def traced_value_escapes():
    kept = []
    def leaky(src, dst, edge):
        kept.append(src.x)
        return src.x
    run(leaky)
    raises(tg.TraceError, lambda: run(lambda s, d, e: s.x + kept[0]), "escaped")
'''


def test_malformed_edge_functions():
    check_cases(MALFORMED_EDGE_FUNCTIONS)


NUMPY_AND_TORCH_CALLS_ON_TRACED_VALUES = COMMON + '''
@case
def np_sum_hints_tg_math():
    err = raises(tg.UnsupportedError, lambda: run(lambda s, d, e: np.sum(s.x), field=xs),
                 "np.sum: numpy functions cannot run on a traced value", "tg.math.sum")
    assert err.hint and "tg.math.sum" in err.hint

@case
def np_ufunc_hints_tg_math():
    raises(tg.UnsupportedError, lambda: run(lambda s, d, e: np.exp(s.x)), "np.exp", "tg.math.exp")
    raises(tg.UnsupportedError, lambda: run(lambda s, d, e: np.add.reduce(s.x, axis=None),
                                            field=xs), "np.add.reduce")

@case
def np_function_without_a_tg_math_twin():
    raises(tg.UnsupportedError, lambda: run(lambda s, d, e: np.cumsum(s.x), field=xs),
           "np.cumsum", "tg.math functions")
    raises(tg.UnsupportedError, lambda: run(lambda s, d, e: np.linalg.norm(s.x), field=xs),
           "np.linalg.norm", "tg.math.norm")

@case
def numpy_operands_on_the_left_still_work():
    w = np.array([0.5, 2.0])
    got = run(lambda s, d, e: w * s.x + np.float64(1.0) - np.ones(2) / 2, field=xs)
    want = np.array([xs[0] + xs[1], xs[1], np.zeros(2)]) * w + np.array([[1.0], [0.5], [0.0]])
    same(got, want)

@case
def comparison_with_numpy_on_the_left():
    got = run(lambda s, d, e: tg.math.where(np.float64(2.5) < s.x, s.x, 0.0))
    same(got, np.array([3.0, 3.0, 0.0]))
'''


def test_numpy_and_torch_calls_on_traced_values():
    check_cases(NUMPY_AND_TORCH_CALLS_ON_TRACED_VALUES)


MALFORMED_USER_REDUCERS = COMMON + '''
@case
def non_callable_combine_fails_at_construction():
    raises(tg.TigaError, lambda: tg.Reducer("r", 0.0, combine=3),
           "Reducer 'r': combine is 3 (int), expected a callable")

@case
def non_callable_finalize_and_lift():
    raises(tg.TigaError, lambda: tg.Reducer("r", 0.0, combine=lambda a, b: a + b, finalize=1.0),
           "Reducer 'r': finalize is 1.0")
    raises(tg.TigaError, lambda: tg.Reducer("r", 0.0, combine=lambda a, b: a + b, lift="abs"),
           "Reducer 'r': lift is 'abs'")

@case
def missing_combine_and_bad_identity():
    raises(tg.TigaError, lambda: tg.Reducer("r", 0.0), "Reducer 'r': combine is required")
    raises(tg.TigaError, lambda: tg.Reducer("r", "zero", combine=lambda a, b: a + b),
           "Reducer 'r': identity is 'zero'")
    raises(tg.TigaError, lambda: tg.Reducer(7, 0.0, combine=lambda a, b: a + b),
           "Reducer: name is 7")

@case
def combine_returning_a_tuple():
    r = tg.Reducer("pair", 0.0, combine=lambda a, b: (a + b, a))
    raises(tg.TraceError, lambda: run(lambda s, d, e: s.x, r),
           "reducer 'pair': combine returned a tuple of 2, expected one array of type f64[]")

@case
def combine_returning_none():
    def combine(a, b):
        a + b
    r = tg.Reducer("lost", 0.0, combine=combine)
    raises(tg.TraceError, lambda: run(lambda s, d, e: s.x, r),
           "reducer 'lost': combine returned None")

@case
def lift_changing_the_shape():
    r = tg.Reducer("wide", 0.0, combine=lambda a, b: a + b,
                   lift=lambda m: tg.math.stack([m, m]))
    raises(tg.TraceError, lambda: run(lambda s, d, e: s.x, r, field=xs),
           "reducer 'wide': lift returned shape (2, 2), expected the message shape (2,)")

@case
def valid_user_reducer_matches_numpy():
    r = tg.Reducer("sumsq", 0.0, combine=lambda a, b: a + b, lift=lambda m: m * m)
    same(run(lambda s, d, e: s.x, r), np.array([4.0 + 9.0, 9.0, 0.0]))

@case
def online_softmax_without_packaging_names_the_functional_form():
    raises(tg.TigaError, lambda: run(lambda s, d, e: s.x, tg.online_softmax()),
           "r = tg.online_softmax(); tg.propagate(g, lambda s, d, e: r(score, value), r, ...)")
    r = tg.online_softmax()
    got = run(lambda s, d, e: r(s.x, s.x * 2.0), r)
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    same(got, np.array([(p * 2 * x).sum(), 6.0, 0.0]), rtol=1e-12)

@case
def message_packaged_for_another_reducer():
    raises(tg.TigaError, lambda: run(lambda s, d, e: tg.online_softmax()(s.x, s.x)),
           "packaged a message for online_softmax but the reducer is sum")
'''


def test_malformed_user_reducers():
    check_cases(MALFORMED_USER_REDUCERS)
