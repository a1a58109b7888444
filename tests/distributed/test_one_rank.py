"""In one process, a one-rank DistributedGraph: the distributed runtime has no loop of its own.
A program runs through core.eval.eval_program with the runtime's distributed rules (loop
bodies included), and each propagate's halo plan runs its Task-IR steps through
interpreter.interpret; results match the same program over the global graph (the oracle).
The halo plan's IR with peers is checked under mpiexec (test_mpi_tasks.py)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import tiga as tg
from tiga.core.primitive import Primitive, abstract_eval_rules
from tiga.core.prims.graph import degrees_p, edge_ids_p
from tiga.core.program import Eqn, GraphProgram, Var
from tiga.core.types import TensorType
from tiga.trace.tracer import bind
from tiga.xla_free_runtime import executor, interpreter
from tiga.xla_free_runtime.distributed import run as dist_run

from ._mpi import under_mpiexec
from .test_mpi_equivalence import _call, _dist, _layer, _problem

pytestmark = [
    pytest.mark.skipif(under_mpiexec(), reason="one rank of its own, not of an mpiexec job"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                       reason="needs the dist extra: pip install 'tiga[dist]'"),
]


@pytest.fixture(scope="module")
def problem():
    g, d = _problem(n=40, seed=7)
    return g, d, _dist(g, d, "rows")


def _counting(monkeypatch, name: str) -> list:
    """Record the calls of run.py's `name` (interpret, run_walk or eval_program), then run
    it."""
    calls, real = [], getattr(dist_run, name)

    def counted(*args, **kw):
        calls.append(args)
        return real(*args, **kw)
    monkeypatch.setattr(dist_run, name, counted)
    return calls


@pytest.mark.parametrize("reducer", ["sum", "max"])
def test_halo_plan_steps_run_through_the_interpreter(problem, monkeypatch, reducer):
    g, d, dg = problem
    steps = _counting(monkeypatch, "interpret")
    layer = _layer(reducer)
    with tg.profile() as prof:
        y = _call(layer, dg, dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    np.testing.assert_allclose(dg.gather(np.asarray(y)),
                               np.asarray(_call(layer, g, d["x"], d["h"], d["w"])),
                               rtol=1e-12, atol=1e-12)
    modules = [m["module"] for m in prof.measured("halo")]
    assert len(modules) == len(steps) == 1
    assert steps[0][0] == interpreter.op_steps(modules[0])
    kinds = {kind for kind, _ in steps[0][0]}
    assert {interpreter.LAUNCH, interpreter.TRANSFER} <= kinds  # launches and their writes


def test_loops_are_task_walks_with_the_distributed_rules(problem, monkeypatch):
    """A distributed program and its repeat and while_loop bodies are Task walks like any
    other (issue 37), run with the same rules: one walk per body call, one halo plan per
    propagate, never eval_program; the result is the one-process result."""
    g, d, dg = problem
    programs = _counting(monkeypatch, "run_walk")
    fallbacks = _counting(monkeypatch, "eval_program")
    plans = _counting(monkeypatch, "interpret")
    layer = _layer("mean")

    def f(x, w, graph):
        x = tg.repeat(3, lambda s: 0.5 * _call(layer, graph, s, s, w), x)
        return tg.while_loop(lambda c: tg.math.max(tg.math.abs(c)) > 0.05,
                             lambda c: 0.5 * _call(layer, graph, c, c, w), x,
                             max_iterations=20)

    got = tg.jit(f)(dg.local(d["x"]), dg.local_edges(d["w"]), dg)
    want = tg.jit(f)(d["x"], d["w"], g)
    np.testing.assert_allclose(dg.gather(np.asarray(got)), np.asarray(want), rtol=1e-10,
                               atol=1e-12)
    assert fallbacks == []
    calls: dict = {}                      # program -> how many times its walk ran
    for args in programs:
        calls[id(args[1])] = calls.get(id(args[1]), 0) + 1
    top, *loops = calls.values()          # (in first-call order: program, repeat body, ...)
    repeat_body, cond, body = loops
    assert (top, repeat_body) == (1, 3) and body >= 1 and cond in (body, body + 1)
    assert len(plans) == 3 + body         # a halo plan per propagate run


def test_other_equations_reading_a_distributed_graph_are_refused(problem, monkeypatch):
    """Only propagate, degrees and edge ids read a DistributedGraph; anything else is
    refused by name before it runs."""
    _, _, dg = problem
    rel = Var(dg.type())
    out = Var(TensorType((), np.dtype(np.float64)))
    reader = Primitive("not_a_reader", "test")     # (typed, so the program checks)
    monkeypatch.setitem(abstract_eval_rules, reader, lambda g: [out.type])
    bad = GraphProgram([rel], [Eqn(reader, (rel,), {}, (out,))], [out])
    with pytest.raises(tg.UnsupportedError, match="not_a_reader on a DistributedGraph"):
        executor.execute(bad, [dg])
    assert dg.broken is None        # refused before any exchange: the partition stays usable


def test_degrees_and_edge_ids_are_this_ranks(problem):
    g, _, dg = problem
    f = tg.jit(lambda graph: (bind(degrees_p, graph, by="dst"),
                              bind(degrees_p, graph, by="src"), bind(edge_ids_p, graph)))
    dst, src, ids = (np.asarray(a) for a in f(dg))
    np.testing.assert_array_equal(dg.gather(dst[:, None])[:, 0], g.degrees("dst"))
    np.testing.assert_array_equal(dg.gather(src[:, None])[:, 0], g.degrees("src"))
    np.testing.assert_array_equal(ids, np.arange(dg.num_edges))     # local edge order


def test_strict_mode_refuses_a_distributed_fallback(problem, monkeypatch):
    g, d, dg = problem
    x = (np.abs(d["x"]) * 4).astype(np.uint8)      # uint8 does not compile on cpu-llvm

    def f(x, graph):
        return tg.propagate(graph, lambda s, dd, e: s.x * s.x, tg.sum(), src={"x": x})

    np.testing.assert_array_equal(dg.gather(np.asarray(tg.jit(f)(dg.local(x), dg))),
                                  np.asarray(tg.jit(f)(x, g)))
    monkeypatch.setattr(tg.config, "strict", True)
    with pytest.raises(tg.UnsupportedError, match="strict mode: a distributed propagate"):
        tg.jit(f)(dg.local(x), dg)
