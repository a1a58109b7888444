"""Hostile field and keyword operands: wrong axes, dtypes, layouts, sizes, typos (issue 13).

Errors must name the field (`src.x`) or keyword; odd but valid layouts must give the
reference interpreter's answer. Each group runs in one subprocess (see _run.py)."""
from __future__ import annotations

from ._run import check_cases

COMMON = '''
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)

class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, scale=1.0):
        return src.x * scale

def both(x, **kw):
    """(compiled, reference) results of one call."""
    m = Scaled()
    return m(graph=g, src={"x": x}, **kw), m.reference(graph=g, src={"x": x}, **kw)

def oracle(x, scale=1.0):
    x = np.asarray(x, np.float64)
    return np.stack([x[0] + x[1], x[1], np.zeros_like(x[0])]) * scale
'''


BAD_FIELDS_NAME_THE_FIELD = COMMON + '''
m = Scaled()

@case
def wrong_leading_axis():
    raises(tg.ShapeError, lambda: m(graph=g, src={"x": np.ones(3)}),
           "src.x: src fields need a leading axis of 2", "found shape (3,)")
    raises(tg.ShapeError, lambda: m(graph=g, src={"x": np.ones(2)}, dst={"h": np.ones(2)}),
           "dst.h: dst fields need a leading axis of 3")
    raises(tg.ShapeError, lambda: m(graph=g, src={"x": np.ones(2)}, edge={"w": np.ones(4)}),
           "edge.w: edge fields need a leading axis of 3")

@case
def zero_d_field():
    raises(tg.ShapeError, lambda: m(graph=g, src={"x": np.float64(2.0)}),
           "src.x: src fields need a leading axis of 2", "found shape ()")

@case
def object_dtype():
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": np.array([1, "a"], object)}),
           "src.x: dtype object is not supported")

@case
def complex_dtype():
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": np.ones(2, complex)}),
           "src.x: dtype complex128 is not supported")

@case
def not_an_array():
    for bad, kind in ((None, "NoneType"), ("ab", "str"), ({"a": 1}, "dict"), (m, "Scaled")):
        raises(tg.DTypeError, lambda: m(graph=g, src={"x": bad}), f"src.x: expected an array",
               f"found {kind}")

@case
def ragged_list():
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": [[1.0], [1.0, 2.0]]}),
           "src.x: could not be read as an array")

@case
def fields_not_a_dict():
    raises(tg.TigaError, lambda: m(graph=g, src=[np.ones(2)]),
           "src: expected a dict of field name -> array", "found list")

@case
def field_name_not_identifier():
    raises(tg.TigaError, lambda: m(graph=g, src={"x y": np.ones(2)}),
           "src: field names must be identifiers, found 'x y'")

@case
def missing_field():
    raises(tg.FieldError, lambda: m(graph=g, src={"y": np.ones(2)}),
           "src.x: no src field named 'x'", "available src fields: y")

@case
def graph_is_not_a_graph():
    raises(tg.TigaError, lambda: m(graph="g", src={"x": np.ones(2)}), "graph: expected a tg.Graph")
'''


def test_bad_fields_name_the_field():
    check_cases(BAD_FIELDS_NAME_THE_FIELD)


KEYWORD_OPERANDS_AND_TYPOS = COMMON + '''
m = Scaled()
x = np.array([2.0, 3.0])

@case
def typo_in_call_keyword():
    raises(tg.TigaError, lambda: m(graph=g, src={"x": x}, egde={"w": np.ones(3)}),
           "egde: unexpected keyword argument of Scaled()", "did you mean edge=?",
           "graph, src, dst, edge", "(scale)")

@case
def typo_in_edge_parameter():
    raises(tg.TigaError, lambda: m(graph=g, src={"x": x}, scael=2.0),
           "scael: unexpected keyword argument", "did you mean scale=?")

@case
def typo_in_functional_form():
    raises(tg.TigaError, lambda: tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x},
                                              srcs={"x": x}),
           "srcs: unexpected keyword argument of tg.propagate", "did you mean src=?")

@case
def keyword_taken_by_update_only():
    class Upd(tg.MessagePassing):
        reducer = tg.sum()
        def edge(self, src, dst, edge):
            return src.x
        def update(self, dst, aggregated, shift=0.0):
            return aggregated + shift
    got = Upd()(graph=g, src={"x": x}, shift=1.5)
    same(got, oracle(x) + 1.5)

@case
def keyword_through_var_keyword_is_accepted():
    got = tg.propagate(g, lambda s, d, e, **kw: s.x * kw["k"], tg.sum(), src={"x": x}, k=2.0)
    same(got, oracle(x, 2.0))

@case
def bad_keyword_values():
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": x}, scale="2"),
           "scale: expected an array", "found str")
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": x}, scale=2**70),
           "scale: Python int 1180591620717411303424 does not fit int64")
    raises(tg.DTypeError, lambda: m(graph=g, src={"x": x}, scale=1j),
           "scale: expected an array", "found complex")

@case
def keyword_value_is_a_runtime_operand():
    for s in (2.0, -0.5, np.float64(3.0)):
        same(m(graph=g, src={"x": x}, scale=s), oracle(x, s))
'''


def test_keyword_operands_and_typos():
    check_cases(KEYWORD_OPERANDS_AND_TYPOS)


ODD_LAYOUTS_GIVE_THE_REFERENCE_ANSWER = COMMON + '''
base = np.arange(12.0).reshape(2, 6)

@case
def negative_strides():
    x = np.array([2.0, 3.0])[::-1]
    for got in both(x):
        same(got, oracle(x))

@case
def non_contiguous_columns():
    x = base[:, ::2]
    for got in both(x):
        same(got, oracle(x))

@case
def fortran_order():
    x = np.asfortranarray(base.reshape(2, 3, 2))
    for got in both(x):
        same(got, oracle(x))

@case
def zero_stride_broadcast():
    x = np.broadcast_to(np.arange(4.0), (2, 4))
    for got in both(x):
        same(got, oracle(x))

@case
def big_endian():
    x = np.array([2.0, 3.0], ">f8")
    for got in both(x):
        same(got, oracle(x))

@case
def misaligned_float32():
    raw = np.zeros(2 * 4 + 1, np.uint8)[1:].view(np.float32)
    raw[:] = [1.5, -2.0]
    for got in both(raw):
        same(got, oracle(raw).astype(np.float32))

@case
def read_only_field():
    x = np.array([2.0, 3.0])
    x.flags.writeable = False
    for got in both(x):
        same(got, oracle(x))

@case
def wide_rows():
    x = np.random.default_rng(0).standard_normal((2, 4096))
    compiled, reference = both(x)
    same(compiled, oracle(x), rtol=1e-12, atol=1e-12)
    same(reference, oracle(x), rtol=1e-12, atol=1e-12)

@case
def empty_graph_and_empty_fields():
    e = tg.Graph.from_csr([0], [], num_src=0)
    out = Scaled()(graph=e, src={"x": np.zeros((0, 3))})
    same(out, np.zeros((0, 3)))

@case
def integer_and_bool_fields():
    xi = np.array([2, 3], np.int32)
    same(Scaled()(graph=g, src={"x": xi}, scale=1), Scaled().reference(graph=g, src={"x": xi},
                                                                      scale=1))
    xb = np.array([True, False])
    same(Scaled()(graph=g, src={"x": xb}), Scaled().reference(graph=g, src={"x": xb}))
'''


def test_odd_layouts_give_the_reference_answer():
    check_cases(ODD_LAYOUTS_GIVE_THE_REFERENCE_ANSWER)
