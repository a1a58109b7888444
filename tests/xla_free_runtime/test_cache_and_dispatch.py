"""Runtime paths of the cpu-llvm route: disk entries as linked shared libraries (and the
MCJIT object layout without a toolchain), damaged entries of either layout, a warm start
that never loads LLVM, staged-program reuse per call signature (and when it must retrace),
unrolled sum folds against float64 oracles, and the native chunk loop against one call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.lower.abi import KernelSignature
from tiga.trace import call_cache
from tiga.trace.message_passing import PropagateCall
from tiga.xla_free_runtime.backends.cpu.native import jit as native_jit
from tiga.xla_free_runtime.backends.cpu.propagate import _argv
from tiga.xla_free_runtime.caches import artifacts
from tiga.xla_free_runtime.caches import executables as cache_mod
from tiga.xla_free_runtime.caches.relations import memo
from tiga.xla_free_runtime.calls.threads import row_chunks, run_chunks
from tiga.xla_free_runtime.executor import call_walk, execute, plan_routes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    cache_mod.CACHE.clear_memory()
    cache_mod.CACHE.reset_stats()
    yield cache_mod.CACHE, tmp_path
    cache_mod.CACHE.clear_memory()


def _program(scale=-0.125):
    g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
    x, w = np.array([2.0, 3.0]), np.array([4.0, 5.0, 2.0])
    call = PropagateCall(g, lambda s, d, e: s.x * e.w + scale, tg.sum(), {"x": x}, {},
                         {"w": w}, None, {})
    program, args = call.staged_program()
    return program, args, [8.0 + 15.0 + 2 * scale, 6.0 + scale, 0.0]


def _damage(entry, how: str) -> None:
    data = bytearray(entry.read_bytes())
    if how == "flip_code_byte":
        data[len(data) // 3] ^= 0x5A
    elif how == "flip_last_byte":
        data[-1] ^= 0xFF
    elif how == "truncate":
        data = data[:len(data) // 2]
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))


@pytest.mark.skipif(native_jit.linker() is None, reason="no C toolchain: MCJIT layout only")
def test_disk_entry_is_a_checked_shared_library(fresh_cache):
    cache, path = fresh_cache
    program, args, want = _program()
    np.testing.assert_allclose(execute(program, args)[0], want)
    (entry,) = path.rglob("*.tga")
    assert entry.read_bytes().startswith(artifacts.FORMAT)
    assert not list(path.rglob(".tiga-*"))        # the dlopened copies are gone
    layout, code, meta = artifacts.read_entry(entry, entry.stem, cache_mod.KINDS)
    sig = KernelSignature.from_json(meta["signature"])
    assert layout == "so" and code.startswith(b"\x7fELF")
    assert sig.symbol == cache_mod.symbol_for(entry.stem)
    assert cache.stats.misses == 1


@pytest.mark.parametrize("layout", ["so", "obj"])
@pytest.mark.parametrize("how", ["flip_code_byte", "flip_last_byte", "truncate", "empty"])
def test_damaged_entry_of_either_layout_is_discarded_and_rebuilt(fresh_cache, monkeypatch,
                                                                 layout, how):
    if layout == "obj":
        monkeypatch.setenv("CC", "/nonexistent/tiga-no-cc")   # no toolchain: MCJIT layout
        assert native_jit.linker() is None
    elif native_jit.linker() is None:
        pytest.skip("no C toolchain")
    cache, path = fresh_cache
    program, args, want = _program(0.375)
    np.testing.assert_allclose(execute(program, args)[0], want)
    (entry,) = path.rglob("*.tga")
    assert artifacts.read_entry(entry, entry.stem, cache_mod.KINDS)[0] == layout
    _damage(entry, how)
    cache.clear_memory()
    np.testing.assert_allclose(execute(program, args)[0], want)
    assert cache.stats.corrupt_discarded == 1 and cache.stats.misses == 2
    assert cache.stats.disk_hits == 0
    cache.clear_memory()
    np.testing.assert_allclose(execute(program, args)[0], want)   # the rebuilt entry loads
    assert cache.stats.disk_hits == 1 and cache.stats.corrupt_discarded == 1


def test_unwritable_cache_dir_counts_write_errors_and_still_runs(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TIGA_CACHE_DIR", str(blocker / "cache"))
    cache_mod.CACHE.clear_memory()
    cache_mod.CACHE.reset_stats()
    try:
        program, args, want = _program(1.5)
        np.testing.assert_allclose(execute(program, args)[0], want)
        assert cache_mod.CACHE.stats.misses == 1
        assert cache_mod.CACHE.stats.disk_write_errors == 1
    finally:
        cache_mod.CACHE.clear_memory()


WARM_START = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tiga as tg

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()
        def edge(self, src, dst, edge):
            return src.x * edge.w

    g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
    y = WeightedSum()(graph=g, src={"x": np.array([[2.0], [3.0]])}, dst={},
                      edge={"w": np.array([4.0, 5.0, 2.0])})
    from tiga.xla_free_runtime.caches.executables import CACHE
    print(json.dumps({"y": np.asarray(y).ravel().tolist(), "stats": CACHE.stats.as_dict(),
                      "llvm_loaded": "llvmlite.binding" in sys.modules}))
""")


def test_warm_start_loads_the_kernel_without_llvm(tmp_path):
    if native_jit.linker() is None:
        pytest.skip("no C toolchain: warm starts load object code through MCJIT")
    env = dict(os.environ, TIGA_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    runs = [json.loads(subprocess.run([sys.executable, "-c", WARM_START], env=env, cwd=ROOT,
                                      capture_output=True, text=True, check=True,
                                      timeout=300).stdout.strip().splitlines()[-1])
            for _ in range(2)]
    cold, warm = runs
    assert cold["y"] == warm["y"] == [23.0, 6.0, 0.0]
    assert cold["stats"]["misses"] == 1 and cold["llvm_loaded"]
    assert warm["stats"]["misses"] == 0 and warm["stats"]["disk_hits"] == 1
    assert not warm["llvm_loaded"]


def test_host_description_does_not_need_llvm():
    desc = native_jit.host_description()
    assert desc and desc == native_jit.host_description()
    if os.path.exists("/proc/cpuinfo"):
        assert "cpuinfo:" in desc


# ---- staged-program reuse -----------------------------------------------------------------------


class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self, scale):
        self.scale = scale

    def edge(self, src, dst, edge):
        return src.x * self.scale


def _graph():
    return tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 1, 1]), num_src=2)


def test_repeated_calls_reuse_the_staged_program_but_see_new_values():
    g, m = _graph(), Scaled(2.0)
    x = np.array([[1.0], [10.0]])
    hits = call_cache.STATS["hits"]
    y1 = np.asarray(m(graph=g, src={"x": x}))
    y2 = np.asarray(m(graph=g, src={"x": 3 * x}))
    assert call_cache.STATS["hits"] > hits
    np.testing.assert_allclose(y1.ravel(), [22.0, 20.0])
    np.testing.assert_allclose(y2.ravel(), [66.0, 60.0])


def test_changed_python_attributes_and_closures_retrace():
    g, m = _graph(), Scaled(2.0)
    x = np.array([[1.0], [10.0]])
    np.testing.assert_allclose(np.asarray(m(graph=g, src={"x": x})).ravel(), [22.0, 20.0])
    m.scale = -1.0                      # a Python number baked into the trace as a constant
    np.testing.assert_allclose(np.asarray(m(graph=g, src={"x": x})).ravel(), [-11.0, -10.0])
    k = 3.0

    def edge(s, d, e):
        return s.x * k

    np.testing.assert_allclose(np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": x}))
                               .ravel(), [33.0, 30.0])
    k = 5.0
    np.testing.assert_allclose(np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": x}))
                               .ravel(), [55.0, 50.0])


def test_captured_arrays_are_never_stale():
    g = _graph()
    x = np.array([[1.0], [10.0]])

    class Weighted(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * self.weight

    m = Weighted()
    m.weight = np.array([2.0])
    np.testing.assert_allclose(np.asarray(m(graph=g, src={"x": x})).ravel(), [22.0, 20.0])
    m.weight[0] = 4.0                   # the same array object, new contents
    np.testing.assert_allclose(np.asarray(m(graph=g, src={"x": x})).ravel(), [44.0, 40.0])


def test_new_field_types_and_graph_sizes_get_their_own_programs():
    m = Scaled(1.0)
    for n in (2, 5):
        g = tg.Graph.from_csr(np.arange(n + 1), np.arange(n)[::-1].copy(), num_src=n)
        for dtype in (np.float32, np.float64):
            x = np.arange(n, dtype=dtype)[:, None]
            y = np.asarray(m(graph=g, src={"x": x}))
            assert y.dtype == dtype
            np.testing.assert_array_equal(y.ravel(), x.ravel()[::-1])
    with pytest.raises(tg.ShapeError):
        m(graph=_graph(), src={"x": np.ones((3, 1))})


# ---- unrolled sums and the native chunk loop ----------------------------------------------------


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


@settings(max_examples=25, deadline=None)
@given(degrees=st.lists(st.integers(0, 41), min_size=1, max_size=40),
       width=st.sampled_from([1, 3, 32, 70]), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_unrolled_weighted_sums_match_a_float64_oracle(degrees, width, dtype, seed):
    rng = np.random.default_rng(seed)
    n = len(degrees)
    row_ptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    col = rng.integers(0, n, int(row_ptr[-1]))
    x = rng.standard_normal((n, width)).astype(dtype)
    w = rng.standard_normal(len(col)).astype(dtype)
    g = tg.Graph.from_csr(row_ptr, col, num_src=n)
    y = np.asarray(WeightedSum()(graph=g, src={"x": x}, edge={"w": w}))
    a = sp.csr_matrix((w.astype(np.float64), col, row_ptr), shape=(n, n))
    want = a @ x.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol * (1 + np.abs(want).max()))


def test_native_chunk_loop_equals_one_call_and_serves_concurrent_callers(monkeypatch):
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    rng = np.random.default_rng(3)
    n, deg = 5000, 9
    row_ptr = np.arange(n + 1, dtype=np.int64) * deg
    col = rng.integers(0, n, n * deg)
    x = rng.standard_normal((n, 8))
    w = rng.standard_normal(n * deg)
    g = tg.Graph.from_csr(row_ptr, col, num_src=n)
    m = WeightedSum()
    want = np.asarray(m(graph=g, src={"x": x}, edge={"w": w}))
    program, args = m._call(g, {"x": x}, {}, {"w": w}, {}).staged_program()
    exe = plan_routes(program, args)[id(program.eqns[0])]
    assert exe.native.drive is not None           # the kernel carries its chunk loop
    out = np.empty_like(want)
    argv = _argv(exe.signature, {"row_ptr": row_ptr, "col_idx": col, "edge_perm": None,
                                 "field:0": x, "field:1": w}, [out])
    exe.native(0, n, argv)                         # one call over every row
    np.testing.assert_array_equal(out, want)
    chunks = row_chunks(row_ptr, 2)
    assert len(chunks) > 1
    results, errors = [], []

    def worker(i):
        try:
            o, xi = np.full_like(want, np.nan), x * i     # both outlive the native calls
            run_chunks(exe.native, chunks, _argv(exe.signature, {
                "row_ptr": row_ptr, "col_idx": col, "edge_perm": None, "field:0": xi,
                "field:1": w}, [o]), 2)
            results.append((i, o))
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3
    for i, o in results:
        np.testing.assert_allclose(o, want * i, rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 3000), degree=st.integers(1, 40), threads=st.integers(1, 8),
       per_thread=st.integers(1, 20))
def test_row_balanced_chunks_cover_rows_in_equal_parts(rows, degree, threads, per_thread):
    row_ptr = np.arange(rows + 1, dtype=np.int64) * degree
    chunks = row_chunks(row_ptr, threads, "row-balanced", per_thread)
    assert chunks[0][0] == 0 and chunks[-1][1] == rows
    assert all(a < b and b == c for (a, b), (c, _) in zip(chunks, chunks[1:] + [(rows, 0)]))
    if rows + rows * degree < 1 << 15 or threads == 1:
        assert chunks == [(0, rows)]        # below the parallel threshold: one call
    else:
        sizes = [b - a for a, b in chunks]
        assert len(chunks) == min(rows, threads * per_thread)
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("kind", ["csr", "stencil"])
def test_runtime_chunks_rows_as_the_launch_schedule_says(monkeypatch, kind):
    """The threads, partition and chunk granularity a call runs with are the ones its
    scheduled Kernel IR prints (launch_op is what TIGA_DUMP writes and explain() shows)."""
    from tiga.xla_free_runtime.backends.cpu import propagate as lp

    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    rng = np.random.default_rng(7)
    n = 8000            # (rows + edges above the parallel threshold: 2 threads)
    if kind == "csr":   # uneven rows: edge-balanced chunks differ in rows
        deg = rng.integers(0, 20, n)
        g = tg.Graph.from_csr(np.concatenate([[0], np.cumsum(deg)]),
                              rng.integers(0, n, int(deg.sum())), num_src=n)
    else:
        g = tg.Graph.stencil((80, 100), [(0, 1), (1, 0), (0, -1), (-1, 0)])
    x = rng.standard_normal((n, 4))
    m = WeightedSum() if kind == "csr" else None
    if m is not None:
        m(graph=g, src={"x": x}, edge={"w": np.ones(g.num_edges)})
        program, args = m._call(g, {"x": x}, {}, {"w": np.ones(g.num_edges)},
                                {}).staged_program()
    else:
        def f(g, x):
            return tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})
        program, args = tg.make_program(f)(g, x), [g, x]
        execute(program, args)
    eqn = program.eqns[0]
    held = call_walk(program, args).launches[id(eqn)]    # (the op the call's lowering bound)
    s = lp.launch_op(eqn, g, held).schedule
    assert s.target == "cpu-llvm" and s.threads == 2 and s.chunks_per_thread == 16
    assert s.row_partition == ("edge-balanced" if kind == "csr" else "row-balanced")
    chunks = memo(g)["chunks"]
    used = [c for key, c in chunks.items() if key[1:4] == (2, s.row_partition, 16)]
    assert used, chunks.keys()
    rp = lp.chunk_row_ptr(g, "dst")
    assert used[0] == row_chunks(rp, 2, s.row_partition, 16)
    sizes = [b - a for a, b in used[0]]
    assert len(used[0]) == 32 and (max(sizes) - min(sizes) <= 1) == (kind == "stencil")
