"""core: printer golden strings, check_program negatives, structural identity, passes."""
import numpy as np
import pytest

import tiga as tg
from tiga.core.passes import cse, dce
from tiga.core.prims.elementwise import binary_p
from tiga.core.program import Eqn, GraphProgram, Lit, Var
from tiga.core.types import TensorType


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _graph():
    return tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)


GOLDEN_WEIGHTED_SUM = """\
{ lambda ; a:f64[2] b:f64[3]. let
    c:f64[3] = propagate[edge_fn={ lambda ; d:f64[] e:f64[]. let
        f:f64[] = mul d e
      in (f,) } reducer=sum roles=(src,edge) names=(x,w) reduce_by=dst update=None] \
const:csr[2,3;3] a b
    g:f64[] = reduce_sum[axes=(0,)] c
  in (g,) }"""

GOLDEN_SYMBOLIC = """\
{ lambda ; a:csr[S,N;E] b:f32[S,16] c:f32[E]. let
    d:f32[N,16] = propagate[edge_fn={ lambda ; e:f32[16] f:f32[]. let
        g:f32[16] = mul e f
      in (g,) } reducer=sum roles=(src,edge) names=(x,w) reduce_by=dst update=None] a b c
  in (d,) }"""

GOLDEN_REPEAT = """\
{ lambda ; a:f32[3]. let
    b:f32[3] = repeat[body={ lambda ; c:f32[3]. let
        d:f32[3] = mul c 2.0:f32[]
      in (d,) } length=2 num_consts=0 num_carry=1 reverse=False] a
    e:f32[] = reduce_sum[axes=(0,)] b
  in (e,) }"""


def test_golden_weighted_sum_program():
    g = _graph()

    def f(x, w):
        return WeightedSum()(graph=g, src={"x": x}, dst={}, edge={"w": w}).sum()

    program = tg.make_program(f)(np.array([2.0, 3.0]), np.array([4.0, 5.0, 2.0]))
    assert str(program) == GOLDEN_WEIGHTED_SUM
    tg.check_program(program)


def test_golden_symbolic_call_program():
    call = WeightedSum()._call(_graph(), {"x": np.zeros((2, 16), np.float32)}, {},
                               {"w": np.zeros(3, np.float32)}, {})
    program, args = call.staged_program()
    assert str(program) == GOLDEN_SYMBOLIC
    tg.check_program(program)
    assert len(args) == 3


def test_golden_repeat_program():
    program = tg.make_program(lambda x: tg.repeat(2, lambda s: s * 2.0, x).sum())(
        np.ones(3, np.float32))
    assert str(program) == GOLDEN_REPEAT


def test_symbolic_program_is_shared_across_graph_sizes():
    def staged(num_dst, num_edges):
        rng = np.random.default_rng(num_dst)
        row_ptr = np.concatenate([[0], np.sort(rng.integers(0, num_edges, num_dst - 1)),
                                  [num_edges]])
        g = tg.Graph.from_csr(row_ptr, rng.integers(0, 4, num_edges), num_src=4)
        call = WeightedSum()._call(g, {"x": np.ones((4, 8))}, {}, {"w": np.ones(num_edges)}, {})
        return call.staged_program()[0]

    a, b = staged(5, 9), staged(7, 30)
    assert a == b and hash(a) == hash(b)
    assert a.structure_key() == b.structure_key()


def test_structure_depends_on_literal_values():
    f1 = tg.make_program(lambda x: x * 2.0)(np.ones(3))
    f2 = tg.make_program(lambda x: x * 3.0)(np.ones(3))
    f3 = tg.make_program(lambda y: y * 2.0)(np.ones(3))
    assert f1 != f2
    assert f1 == f3


def _f32(*shape):
    return TensorType(shape, tg.float32)


def test_check_program_rejects_use_before_definition():
    a, b, c = Var(_f32(3)), Var(_f32(3)), Var(_f32(3))
    prog = GraphProgram((a,), (Eqn(binary_p["add"], (a, b), {}, (c,)),), (c,))
    with pytest.raises(tg.ProgramError, match="used before it is defined"):
        tg.check_program(prog)


def test_check_program_rejects_double_assignment():
    a, c = Var(_f32(3)), Var(_f32(3))
    eqn = Eqn(binary_p["add"], (a, a), {}, (c,))
    prog = GraphProgram((a,), (eqn, Eqn(binary_p["mul"], (a, a), {}, (c,))), (c,))
    with pytest.raises(tg.ProgramError, match="assigned twice"):
        tg.check_program(prog)


def test_check_program_rejects_wrong_output_type():
    a, c = Var(_f32(3)), Var(_f32(4))
    prog = GraphProgram((a,), (Eqn(binary_p["add"], (a, a), {}, (c,)),), (c,))
    with pytest.raises(tg.ProgramError, match="outputs typed f32\\[4\\] but the rule gives"):
        tg.check_program(prog)


def test_check_program_reports_rule_failure():
    a, b, c = Var(_f32(3)), Var(_f32(2)), Var(_f32(3))
    prog = GraphProgram((a, b), (Eqn(binary_p["add"], (a, b), {}, (c,)),), (c,))
    with pytest.raises(tg.ProgramError, match="abstract evaluation failed"):
        tg.check_program(prog)


def test_check_program_rejects_undefined_output():
    a, z = Var(_f32(3)), Var(_f32(3))
    with pytest.raises(tg.ProgramError, match="outs\\[0\\]"):
        tg.check_program(GraphProgram((a,), (), (z,)))


def test_dce_and_cse():
    def f(x):
        unused = tg.math.exp(x)  # noqa: F841
        return tg.math.sin(x) + tg.math.sin(x)

    program = tg.make_program(f)(np.ones(3))
    names = [e.primitive.name for e in program.eqns]
    assert names.count("sin") == 2 and "exp" in names
    cleaned = dce(cse(program))
    assert [e.primitive.name for e in cleaned.eqns] == ["sin", "add"]
    tg.check_program(cleaned)
    x = np.linspace(0, 1, 3)
    np.testing.assert_allclose(tg.eval_program(cleaned, x)[0], 2 * np.sin(x))


def test_eval_program_checks_arity():
    program = tg.make_program(lambda x: x + 1.0)(np.ones(2))
    with pytest.raises(tg.ProgramError, match="takes 1 inputs, got 2"):
        tg.eval_program(program, np.ones(2), np.ones(2))


def test_literal_printing_is_deterministic():
    a = Var(_f32(3))
    c = Var(_f32(3))
    lit = Lit(np.array([1.5, 2.0, 3.0], np.float32), _f32(3))
    prog = GraphProgram((a,), (Eqn(binary_p["add"], (a, lit), {}, (c,)),), (c,))
    assert str(prog) == ("{ lambda ; a:f32[3]. let\n    b:f32[3] = add a [1.5,2.0,3.0]:f32[3]\n"
                         "  in (b,) }")
