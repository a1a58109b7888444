"""The native worker pool (lower/llvm/pool.py, xla_free_runtime/backends/cpu/native/pool.py) and the
aligned staging of gathered fields (propagate.py): every chunk runs exactly once whether
the workers spin, sleep on the futex, arrive late or are more than the cores; concurrent
Python callers; a forked child; misaligned source arrays. Oracles: one kernel call over all
rows, scipy CSR in float64."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import tiga as tg
from tiga.lower.llvm import pool as protocol
from tiga.xla_free_runtime.backends.cpu.native import pool as native_pool
from tiga.xla_free_runtime.backends.cpu.propagate import _argv
from tiga.xla_free_runtime.backends.relation_arrays import walked_csr
from tiga.xla_free_runtime.calls import threads as T
from tiga.xla_free_runtime.executor import plan_routes

pytestmark = pytest.mark.skipif(not protocol.supported(),
                                reason="the native pool is built for x86-64 Linux only")


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _problem(n=6000, deg=7, width=8, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    row_ptr = np.arange(n + 1, dtype=np.int64) * deg
    col = rng.integers(0, n, n * deg)
    x = rng.standard_normal((n, width)).astype(dtype)
    w = rng.standard_normal(n * deg).astype(dtype)
    return row_ptr, col, x, w


def _kernel(row_ptr, col, x, w):
    g = tg.Graph.from_csr(row_ptr, col, num_src=len(row_ptr) - 1)
    m = WeightedSum()
    program, args = m._call(g, {"x": x}, {}, {"w": w}, {}).staged_program()
    return g, m, plan_routes(program, args)[id(program.eqns[0])]


def _run(exe, row_ptr, col, x, w, threads):
    out = np.full((len(row_ptr) - 1, x.shape[1]), np.nan, x.dtype)   # a missed chunk shows
    argv = _argv(exe.signature, {"row_ptr": row_ptr, "col_idx": col, "edge_perm": None,
                                 "field:0": x, "field:1": w}, [out])
    T.run_chunks(exe.native, T.row_chunks(row_ptr, threads), argv, threads)
    return out


def _one_call(exe, row_ptr, col, x, w):
    out = np.empty((len(row_ptr) - 1, x.shape[1]), x.dtype)
    exe.native(0, len(row_ptr) - 1, _argv(exe.signature, {
        "row_ptr": row_ptr, "col_idx": col, "edge_perm": None, "field:0": x, "field:1": w},
        [out]))
    return out


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_every_chunk_runs_once_with_spinning_and_sleeping_workers(threads):
    row_ptr, col, x, w = _problem()
    _, _, exe = _kernel(row_ptr, col, x, w)
    assert native_pool._pool_entries(exe.native) is not None
    want = _one_call(exe, row_ptr, col, x, w)
    np.testing.assert_array_equal(_run(exe, row_ptr, col, x, w, threads), want)
    st = native_pool._NATIVE["state"]
    for spin in (native_pool.WORKER_SPIN, 0, 50):    # 0: every job wakes the workers from the futex
        st[protocol.SPIN] = spin
        # (scaled by powers of two, so the expected sums scale exactly)
        got = [_run(exe, row_ptr, col, x * 2.0 ** (k % 7), w, threads) for k in range(30)]
        for k, o in enumerate(got):
            np.testing.assert_array_equal(o, want * 2.0 ** (k % 7))
        assert st[protocol.ENTRY] & 0x1FFFF == protocol.CLOSED   # closed, no worker inside
    st[protocol.SPIN] = native_pool.WORKER_SPIN
    assert native_pool._NATIVE["workers"] >= threads - 1


def test_concurrent_python_callers_share_the_pool_safely():
    row_ptr, col, x, w = _problem(seed=1)
    _, _, exe = _kernel(row_ptr, col, x, w)
    want = _one_call(exe, row_ptr, col, x, w)
    errors = []

    def caller(i):
        try:
            for _ in range(15):
                o = _run(exe, row_ptr, col, x * 2.0 ** i, w, 2)
                np.testing.assert_array_equal(o, want * 2.0 ** i)
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers():
    row_ptr, col, x, w = _problem(seed=2)
    _, _, exe = _kernel(row_ptr, col, x, w)
    want = _one_call(exe, row_ptr, col, x, w)
    _run(exe, row_ptr, col, x, w, 2)             # the parent's pool exists before the fork
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # pragma: no cover - runs in the child
        ok = False
        try:
            ok = bool(np.array_equal(_run(exe, row_ptr, col, x, w, 2), want))
        finally:
            os.write(wfd, b"1" if ok else b"0")
            os._exit(0)
    os.close(wfd)
    answer = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert answer == b"1"


@pytest.mark.parametrize("threads", ["1", "2"])   # one thread stages every misaligned source
@pytest.mark.parametrize("offset", [0, 4, 16, 48])
@pytest.mark.parametrize("width,dtype", [(32, np.float32), (16, np.float32), (8, np.float64),
                                         (5, np.float32)])
def test_misaligned_sources_give_the_same_result(offset, width, dtype, threads, monkeypatch):
    monkeypatch.setenv("TIGA_NUM_THREADS", threads)
    row_ptr, col, x, w = _problem(n=3000, deg=9, width=width, seed=3, dtype=dtype)
    g = tg.Graph.from_csr(row_ptr, col, num_src=len(row_ptr) - 1)
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(x.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset - offset % itemsize
    shifted = raw[start:start + x.nbytes].view(dtype).reshape(x.shape)
    shifted[:] = x
    m = WeightedSum()
    y = np.asarray(m(graph=g, src={"x": shifted}, edge={"w": w}))
    rp, ci, _ = walked_csr(g, "dst")
    want = sp.csr_matrix((w.astype(np.float64), ci, rp), shape=(len(rp) - 1,) * 2) @ \
        x.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol * (1 + np.abs(want).max()))
    np.testing.assert_array_equal(y, np.asarray(m(graph=g, src={"x": x}, edge={"w": w})))
    np.testing.assert_array_equal(shifted, x)       # the caller's array is only read


def test_huge_page_advice_keeps_contents_and_results():
    from tiga.xla_free_runtime.backends.cpu import propagate as LP
    rng = np.random.default_rng(5)
    n, deg = 1 << 16, 4
    row_ptr = np.arange(n + 1, dtype=np.int64) * deg
    col = rng.integers(0, n, n * deg)
    x = rng.standard_normal((n, 32)).astype(np.float32)      # 8 MiB: advised from its 2nd call
    w = rng.standard_normal(n * deg).astype(np.float32)
    keep = x.copy()
    g = tg.Graph.from_csr(row_ptr, col, num_src=n)
    m = WeightedSum()
    ys = [np.asarray(m(graph=g, src={"x": x}, edge={"w": w})) for _ in range(3)]
    LP._huge_pages(x)
    LP._huge_pages(x)
    np.testing.assert_array_equal(x, keep)
    want = sp.csr_matrix((w.astype(np.float64), col, row_ptr), shape=(n, n)) @ \
        x.astype(np.float64)
    for y in ys:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * (1 + np.abs(want).max()))
    np.testing.assert_array_equal(ys[0], ys[2])


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("nbytes", [1, 63, 64 * 7 + 5, (3 << 20) + 44])
def test_parallel_copy_copies_every_byte(threads, nbytes):
    row_ptr, col, x, w = _problem(seed=4)
    _, _, exe = _kernel(row_ptr, col, x, w)
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    native_pool.parallel_copy(exe.native, dst, src, threads)
    np.testing.assert_array_equal(dst, src)


def test_large_misaligned_source_is_staged_by_the_pool(monkeypatch):
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    row_ptr, col, x, w = _problem(n=24000, deg=5, width=32, seed=6, dtype=np.float32)
    raw = np.empty(x.nbytes + 128, np.uint8)           # 3 MiB: staged with two threads
    start = (-raw.ctypes.data) % 64 + 16
    shifted = raw[start:start + x.nbytes].view(np.float32).reshape(x.shape)
    shifted[:] = x
    g = tg.Graph.from_csr(row_ptr, col, num_src=len(row_ptr) - 1)
    m = WeightedSum()
    want = sp.csr_matrix((w.astype(np.float64), col, row_ptr), shape=(24000, 24000)) @ \
        x.astype(np.float64)
    for _ in range(3):
        y = np.asarray(m(graph=g, src={"x": shifted}, edge={"w": w}))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * (1 + np.abs(want).max()))
    np.testing.assert_array_equal(y, np.asarray(m(graph=g, src={"x": x}, edge={"w": w})))


@pytest.mark.parametrize("width,listed", [(32, True), (5, False)])   # 20-byte rows: never staged
def test_explain_lists_the_possible_aligned_copy(width, listed):
    row_ptr, col, x, w = _problem(n=4000, deg=6, width=width, seed=7, dtype=np.float32)
    g = tg.Graph.from_csr(row_ptr, col, num_src=len(row_ptr) - 1)
    ex = WeightedSum().explain(graph=g, src={"x": x}, edge={"w": w})
    found = [m for m in ex.materialized if "aligned copy of src.x" in m[0]]
    assert bool(found) == listed
    if listed:
        assert found[0][1] == x.nbytes and "mid cache line" in found[0][2]
