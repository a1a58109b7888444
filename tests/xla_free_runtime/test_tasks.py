"""The runtime runs a program by interpreting its Task IR (xla_free_runtime/interpreter.py): the
steps are the module's ops in order, each gf_task.launch runs its propagate's compiled
kernel, other equations run through the eval rules, arguments are transferred before their
first reader and released after their last. Oracle: the reference interpreter
(eval_program without overrides) on the same program."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.core.errors import UnsupportedError
from tiga.core.eval import eval_program
from tiga.core.prims.graph import propagate_p
from tiga.lower import CPU_LLVM_AVAILABLE
from tiga.lower.ir.base import RelationOp, TensorOp
from tiga.lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TransferOp, parse_task
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime import interpreter as tasks
from tiga.xla_free_runtime.executor import execute

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")

REDUCERS = {"sum": tg.sum, "max": tg.max, "min": tg.min, "mean": tg.mean}

EQUATIONS = (tasks.LAUNCH, tasks.RUN)    # the steps that run an equation: launches, rules


def _graph(seed: int, n: int = 40, e: int = 200):
    rng = np.random.default_rng(seed)
    return tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n,
                             num_dst=n), rng


def _two_layers(first: str, second: str):
    def f(g, x, w):
        h = tg.propagate(g, lambda s, d, e: s.x, REDUCERS[first](), src={"x": x})
        h = tg.math.tanh(h * w)
        return tg.propagate(g, lambda s, d, e: s.h * d.x, REDUCERS[second](),
                            src={"h": h}, dst={"x": x})
    return f


def _computing_ops(module) -> list:
    """The module's ops that compute, as the primitive they run, in order."""
    out = []
    for op in module.body.ops:
        if isinstance(op, (TransferOp, ReleaseOp, JoinOp, RelationOp)) or \
                (isinstance(op, TensorOp) and op.prim == "constant"):
            continue
        out.append(propagate_p.name if isinstance(op, TaskLaunchOp) else op.prim)
    return out


@settings(max_examples=12, deadline=None)
@given(first=st.sampled_from(sorted(REDUCERS)), second=st.sampled_from(sorted(REDUCERS)),
       seed=st.integers(0, 2**16), width=st.integers(1, 9))
def test_the_call_runs_the_task_ir_in_order_and_matches_the_reference(first, second, seed,
                                                                      width):
    g, rng = _graph(seed)
    x = rng.standard_normal((40, width)).astype(np.float32)
    w = np.float32(rng.standard_normal())
    program = tg.make_program(_two_layers(first, second))(g, x, w)
    walk = executor.task_walk(program)
    assert isinstance(walk, tasks.TaskWalk)
    ran, launched = [], []
    real_eqn, real_launch = tasks.run_eqn, executor.run_propagate

    def record_eqn(eqn, *a):
        ran.append(eqn.primitive.name)
        return real_eqn(eqn, *a)

    def record_launch(route, eqn, *a):     # (a launch is a step of its own: no eval rule)
        ran.append(eqn.primitive.name)
        launched.append(eqn)
        return real_launch(route, eqn, *a)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(tasks, "run_eqn", record_eqn)
        m.setattr(executor, "run_propagate", record_launch)
        got = execute(program, [g, x, w])
    assert ran == _computing_ops(walk.module)          # the module's op order, all of it
    assert launched == [e for e in program.eqns if e.primitive is propagate_p]   # compiled
    want = eval_program(program, g, x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_each_argument_is_transferred_before_its_first_reader_and_released_after_its_last():
    g, rng = _graph(1)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    program = tg.make_program(_two_layers("sum", "max"))(g, x, np.float32(0.5))
    steps = executor.task_walk(program).steps
    runs = [i for i, (code, _) in enumerate(steps) if code in EQUATIONS]
    for pos, binder in enumerate(program.in_binders):
        readers = [i for i in runs if any(a is binder for a in steps[i][1].inputs)]
        transfer = [i for i, s in enumerate(steps) if s == (tasks.TRANSFER, pos)]
        release = [i for i, s in enumerate(steps) if s[0] is tasks.RELEASE and s[1] is binder]
        assert len(transfer) == 1 and len(release) == 1 and readers
        assert transfer[0] < readers[0] and release[0] > readers[-1]
    assert steps[-1] == (tasks.JOIN, None)


def test_each_intermediate_is_released_once_after_its_last_reader():
    """Values the program computes and does not return are dropped as soon as nothing reads
    them (their memory is reused by later equations instead of held to the end)."""
    g, rng = _graph(4)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    program = tg.make_program(_two_layers("sum", "max"))(g, x, np.float32(0.5))
    walk = executor.task_walk(program)
    steps = walk.steps
    returned = {id(v) for v in program.outs}
    made = {id(v): i for i, (c, e) in enumerate(steps) if c in EQUATIONS for v in e.outputs}
    assert len(made) > len(program.outs)          # there are intermediates to release
    for v_id, at in made.items():
        readers = [i for i, (c, e) in enumerate(steps)
                   if c in EQUATIONS and any(id(a) == v_id for a in e.inputs)]
        released = [i for i, (c, v) in enumerate(steps) if c is tasks.RELEASE and id(v) == v_id]
        if v_id in returned:
            assert not released
        else:
            assert len(released) == 1 and released[0] > max(readers, default=at)
    # in the IR: a task's output waits on its readers' events; a value only tensor ops
    # compute and read is released in program order (no events)
    ops = walk.module.body.ops
    launched = {v.name for op in ops if isinstance(op, TaskLaunchOp) for v in op.results}
    for op in ops:
        if isinstance(op, ReleaseOp) and op.value.name in launched:
            assert op.deps
    assert any(isinstance(op, ReleaseOp) and not op.deps for op in ops)


def test_a_released_intermediate_is_gone_for_later_steps():
    g, rng = _graph(5)
    x = rng.standard_normal((40, 2)).astype(np.float32)
    program = tg.make_program(_two_layers("sum", "sum"))(g, x, np.float32(2.0))
    walk = executor.task_walk(program)
    steps = list(walk.steps)
    first = next(e for c, e in steps if c is tasks.LAUNCH)     # (the first propagate)
    at = next(i for i, (c, v) in enumerate(steps) if c is tasks.RELEASE and
              v is first.outputs[0])
    steps.insert(steps.index((tasks.LAUNCH, first)) + 1, steps.pop(at))
    early = dataclasses.replace(walk, steps=tuple(steps))
    with pytest.raises(KeyError):
        tasks.run_walk(early, program, [g, x, np.float32(2.0)], executor.OVERRIDES,
                       launch=executor._launcher(program, walk))


def test_a_released_argument_is_gone_for_later_steps():
    """The interpreter honours the plan: a walk whose release comes before a reader fails
    there (it does not read a value the plan has released)."""
    g, rng = _graph(2)
    x = rng.standard_normal((40, 2)).astype(np.float32)
    program = tg.make_program(_two_layers("sum", "sum"))(g, x, np.float32(2.0))
    walk = executor.task_walk(program)
    steps = list(walk.steps)
    release = next(i for i, s in enumerate(steps)
                   if s[0] is tasks.RELEASE and s[1] is program.in_binders[1])
    steps.insert(next(i for i, (c, _) in enumerate(steps) if c in EQUATIONS),
                 steps.pop(release))
    early = dataclasses.replace(walk, steps=tuple(steps))
    with pytest.raises(KeyError):
        tasks.run_walk(early, program, [g, x, np.float32(2.0)], executor.OVERRIDES,
                       launch=executor._launcher(program, walk))


def test_equal_programs_keep_their_own_walks():
    g, rng = _graph(3)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    make = tg.make_program(_two_layers("sum", "mean"))
    p1, p2 = make(g, x, np.float32(1.0)), make(g, x, np.float32(1.0))
    assert p1 is not p2
    w1, w2 = executor.task_walk(p1), executor.task_walk(p2)
    assert w1 is not w2 and executor.task_walk(p1) is w1
    assert [x for c, x in w2.steps if c in EQUATIONS] == list(p2.eqns)
    for p in (p1, p2, p1):
        np.testing.assert_allclose(execute(p, [g, x, np.float32(1.0)])[0],
                                   eval_program(p, g, x, np.float32(1.0))[0], rtol=2e-5,
                                   atol=2e-5)


def test_loop_bodies_are_walked_too():
    g, rng = _graph(4)
    x = rng.standard_normal((40, 3)).astype(np.float32)

    def f(g, x):
        def body(h):
            return tg.math.tanh(tg.propagate(g, lambda s, d, e: s.h, tg.mean(),
                                             src={"h": h}))
        return tg.repeat(3, body, x)

    program = tg.make_program(f)(g, x)
    built = []
    real = executor.build_walk
    with pytest.MonkeyPatch.context() as m:
        m.setattr(executor, "build_walk", lambda p, *rest: built.append(p) or real(p, *rest))
        got = execute(program, [g, x])
    assert len(built) == 2 and all(
        isinstance(executor.task_walk(p), tasks.TaskWalk)
        for p in built)        # the program and its loop body
    np.testing.assert_allclose(got[0], eval_program(program, g, x)[0], rtol=2e-5, atol=2e-5)


def test_a_program_the_ir_does_not_express_runs_under_eval_program(monkeypatch):
    g, rng = _graph(5)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    program = tg.make_program(_two_layers("max", "sum"))(g, x, np.float32(1.5))

    def refuse(*a, **k):
        raise UnsupportedError("no stage for this")

    monkeypatch.setattr(executor.pipeline, "lower_call", refuse)   # (the executor lowers)
    walk = executor.task_walk(program)
    assert isinstance(walk, tasks.NoWalk) and "no stage for this" in walk.reason
    np.testing.assert_allclose(execute(program, [g, x, np.float32(1.5)])[0],
                               eval_program(program, g, x, np.float32(1.5))[0], rtol=2e-5,
                               atol=2e-5)
    assert tasks.describe_walk(walk).startswith("eval_program")


def test_explain_names_the_walked_module():
    g, rng = _graph(6)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    f = _two_layers("sum", "min")
    text = str(tg.jit(f).lower(g, x, np.float32(1.0)).compile().explain())
    line = next(ln for ln in text.splitlines() if ln.startswith("tasks:"))
    assert "2 gf_task.launch (interior, page 0 of 1, rank 0 of 1)" in line
    assert "mul, tanh through the eval rules" in line and "3 transfer(s)" in line


CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime import interpreter as tasks
from tiga.xla_free_runtime.caches import programs as program_cache
rng = np.random.default_rng(0)
g = tg.Graph.from_coo(rng.integers(0, 30, 90), rng.integers(0, 30, 90), num_src=30, num_dst=30)
x = rng.standard_normal((30, 4)).astype(np.float32)
def f(g, x):
    h = tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})
    return tg.propagate(g, lambda s, d, e: s.h, tg.max(), src={"h": h * 2.0})
jf = tg.jit(f)
jf(g, x)
walked = [str(w.module) for _, per in program_cache.entries("walks") for w in per.values()
          if isinstance(w, tasks.TaskWalk)]
json.dump(walked, open(sys.argv[1], "w"))
"""


def test_dump_task_writes_the_module_the_call_walks(tmp_path):
    out = tmp_path / "walked.json"
    env = dict(os.environ, TIGA_DUMP="task", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, check=True, timeout=240)
    walked = json.loads(out.read_text())
    dumps = sorted((tmp_path / "dump").glob("*.task.mlir"))
    assert len(walked) == 1 and len(dumps) == 1
    assert dumps[0].read_text() == walked[0]
    module = parse_task(dumps[0].read_text())
    assert sum(isinstance(op, TaskLaunchOp) for op in module.body.ops) == 2


def test_a_paged_program_is_walked_and_its_launch_pages(tmp_path):
    pytest.importorskip("zarr", minversion="3.1")
    n, k = 64, 3
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    with tg.store.create(tmp_path / "s", num_src=n, num_dst=n) as w:
        w.append_csr_chunk(rp, ci)
    paged = tg.Graph.open(tmp_path / "s")
    x = np.random.default_rng(7).standard_normal((n, 2)).astype(np.float32)
    f = _two_layers("sum", "max")
    with tg.scope(page_rows=16):
        got = tg.jit(f)(paged, x, np.float32(0.5))
    program = tg.make_program(f)(paged, x, np.float32(0.5))
    assert isinstance(executor.task_walk(program), tasks.TaskWalk)
    mem = tg.Graph.from_csr(rp, ci, num_src=n)
    want = eval_program(tg.make_program(f)(mem, x, np.float32(0.5)), mem, x, np.float32(0.5))
    np.testing.assert_allclose(np.asarray(got), want[0], rtol=2e-5, atol=2e-5)


def test_large_literals_enter_the_task_ir_as_arguments():
    """A captured array above LIFT_ELEMENTS is a transferred argument of the Task IR, not a
    constant op spelled out element by element; small literals stay constants."""
    g, rng = _graph(8)
    big = rng.standard_normal((40, 5)).astype(np.float32)
    assert big.size > tasks.LIFT_ELEMENTS

    def f(x):
        h = tg.propagate(g, lambda s, d, e: s.x * s.w, tg.sum(), src={"x": x, "w": big})
        return h * 3.0

    x = rng.standard_normal((40, 5)).astype(np.float32)
    program = tg.make_program(f)(x)
    walk = executor.task_walk(program)
    args = walk.module.body.args
    assert len(args) == len(program.in_binders) + 1 and tuple(args[-1].type.shape) == (40, 5)
    constants = [op for op in walk.module.body.ops
                 if isinstance(op, TensorOp) and op.prim == "constant"]
    assert constants and all(np.size(op.params[0][1]) <= tasks.LIFT_ELEMENTS
                             for op in constants)
    assert not any(s == (tasks.TRANSFER, len(program.in_binders)) for s in walk.steps)
    np.testing.assert_allclose(execute(program, [x])[0], eval_program(program, x)[0],
                               rtol=2e-5, atol=2e-5)
