"""A paged (stored) relation under a Triton backend pages (issue 28 item 3): its pages run the
Triton kernel rendered once for the page-local CSR, forward and gradient, in Triton's
interpreter on CPU. Two routes are checked: pages on the host (no device tier here: the
interpreter reads the host page buffers), and pages streamed host -> device through the device
tier, double-buffered, under the "device" budget, against the stand-in CUDA runtime of
test_device_tier (its "device memory" is host memory, so the interpreter reads it in place).
Oracle: the reference interpreter on the same relation held in memory."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

import tiga as tg
from tiga.lower.ir.kernel import LaunchOp
from tiga.lower.ir.task import TaskLaunchOp, TransferOp, parse_task
from tiga.xla_free_runtime.backends.triton import launch
from tiga.xla_free_runtime.reports.runs import COUNTERS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stand_in_cuda import StandInRuntime  # noqa: E402

pytest.importorskip("zarr", minversion="3.1")

N, K, F = 300, 4, 3


class Mix(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.b


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    rng = np.random.default_rng(3)
    rp = np.arange(N + 1, dtype=np.int64) * K
    ci = rng.integers(0, N, N * K).astype(np.int32)
    x = rng.normal(size=(N, F)).astype(np.float32)
    b = rng.normal(size=(N, F)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, size=(N * K, 1)).astype(np.float32)
    path = tmp_path_factory.mktemp("paged_triton") / "s"
    with tg.store.create(path, num_src=N, num_dst=N, overwrite=True) as wr:
        wr.append_csr_chunk(rp[:151], ci[:rp[150]])
        wr.append_csr_chunk(rp[150:] - rp[150], ci[rp[150]:])
        wr.append_field("x", x, role="src")
    mem = tg.Graph.from_csr(rp, ci, num_src=N)
    return path, mem, x, b, w


def call(g, x, b, w):
    return dict(graph=g, src={"x": x}, dst={"b": b}, edge={"w": w})


def test_a_paged_relation_pages_under_the_triton_interpreter(stored, interpreter):
    path, mem, x, b, w = stored
    g = tg.Graph.open(path)
    want = np.asarray(Mix().reference(**call(mem, x, b, w)))
    with tg.scope(page_rows=64), tg.profile() as prof:
        got = np.asarray(Mix()(**call(g, tg.store.open(path)["x"], b, w)))
    (stats,) = prof.measured("paged")
    assert stats.pages == -(-N // 64) and stats.edges == N * K
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- the device route, against a stand-in CUDA runtime -----------------------------------------

def _host_view(rows):
    """What torch.as_tensor(rows, device="cuda") is on a GPU: a tensor over the memory, in
    place; here that memory is the stand-in's host buffer, so a CPU tensor."""
    import torch
    iface = rows.__cuda_array_interface__
    dtype = np.dtype(iface["typestr"])
    n = int(np.prod(iface["shape"], dtype=np.int64)) * dtype.itemsize
    raw = (ctypes.c_ubyte * n).from_address(iface["data"][0])
    return torch.from_numpy(np.ctypeslib.as_array(raw).view(dtype).reshape(iface["shape"]))


def _install(monkeypatch) -> StandInRuntime:
    from tiga.torch_bridge import triton_buffers
    from tiga.xla_free_runtime.memory.tiers import device as device_tier
    rt = StandInRuntime()
    monkeypatch.setattr(device_tier, "runtime", lambda: rt)
    monkeypatch.setattr(triton_buffers, "on_device", _host_view)
    return rt


@pytest.fixture
def stand_in(monkeypatch, interpreter):
    return _install(monkeypatch)


def _double_buffered(module) -> int:
    """Checks the plan's device copies: each page's launch waits on its own host -> device
    copies, which wait on its loads, and the next launched page's copies come before it.
    Returns the number of pages."""
    ops = module.body.ops
    launches = [op for op in ops if isinstance(op, TaskLaunchOp)]
    copied, producer = set(), {}
    for op in ops:
        if isinstance(op, TransferOp):
            producer[op.event.name] = op
            if op.dst_tier == "device" and op.kind == "page" and op.page == op.page:
                if op.deps and producer[op.deps[0].name].dst_tier == "host":
                    assert producer[op.deps[0].name].page == op.page
                copied.add(op.page)
        elif isinstance(op, TaskLaunchOp):
            i = launches.index(op)
            for e in op.deps:
                src = producer[e.name]
                assert src.dst_tier == "device", "a launch reads its page on the device"
            if i + 1 < len(launches):
                assert launches[i + 1].page in copied, "the next page's copy is not ahead"
    writes = [op for op in ops if isinstance(op, TransferOp) and op.kind == "write"]
    assert writes and {op.src_tier for op in writes} == {"device"}
    return len(launches)


def test_pages_stream_through_the_device_tier_double_buffered(stored, stand_in,
                                                             monkeypatch):
    path, mem, x, b, w = stored
    g = tg.Graph.open(path)
    want = np.asarray(Mix().reference(**call(mem, x, b, w)))
    builds = []
    build = launch.TritonPlan.build.__func__
    monkeypatch.setattr(launch.TritonPlan, "build", classmethod(
        lambda cls, *a: builds.append(a[1]) or build(cls, *a)))
    with tg.scope(page_rows=64, budgets={"device": "64KB"}), tg.profile() as prof:
        got = np.asarray(Mix()(**call(g, tg.store.open(path)["x"], b, w)))
        rep = tg.memory.report()["device"]
    # one kernel for every page, planned once per run from an empty page (no sizes in it)
    assert len(builds) == 1 and builds[0].num_dst == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (stats,) = prof.measured("paged")
    pages = -(-N // 64)
    assert stats.route == "triton-interpreter" and _double_buffered(stats.module) == pages
    # per page: the CSR (row_ptr, col_idx) and x, b, w in, the result rows out
    assert (stand_in.count(1), stand_in.count(2)) == (5 * pages, pages)
    # every page buffer copies on a stream of its own that does not wait for the kernels'
    assert stand_in.nonblocking == stand_in.streams > 0
    assert stats.bytes_device["from"] == got.nbytes
    assert 0 < rep["peak"] <= 64_000 and rep["bytes"] == 0 and not stand_in.buffers


def test_the_device_budget_bounds_the_page_buffers(stored, stand_in):
    path, mem, x, b, w = stored
    with tg.scope(page_rows=64, budgets={"device": "2KB"}):
        with pytest.raises(tg.StorageError, match="device budget.*page_rows"):
            Mix()(**call(tg.Graph.open(path), x, b, w))
        assert tg.memory.report()["device"]["bytes"] == 0 and not stand_in.buffers


def _grad_oracle(mem, x, w, cot):
    """d sum(Mix(x) * cot) / d(x, w) in float64 numpy."""
    rp, ci = (np.asarray(a) for a in mem.resolve_csr())
    dst = np.repeat(np.arange(len(rp) - 1), np.diff(rp))
    t = np.tanh(x.astype(np.float64))
    gx = np.zeros_like(t)
    np.add.at(gx, ci, cot[dst] * w[:, :1] * (1 - t[ci] ** 2))
    gw = (cot[dst] * t[ci]).sum(axis=1, keepdims=True)
    return gx, gw


@pytest.mark.parametrize("route", ["host", "device"])
def test_grad_wrt_the_source_field_pages_the_transposed_relation(stored, interpreter,
                                                                  monkeypatch, route):
    path, mem, x, b, w = stored
    if route == "device":
        rt = _install(monkeypatch)
    cot = np.random.default_rng(5).normal(size=(N, F)).astype(np.float32)
    g = tg.Graph.open(path)

    def loss(x, w):
        return tg.math.sum(Mix()(**call(g, x, b, w)) * cot)
    with tg.scope(page_rows=50), tg.profile() as prof:
        gx, gw = tg.grad(loss, argnums=(0, 1))(x, w)
    want_x, want_w = _grad_oracle(mem, x, w, cot)
    np.testing.assert_allclose(np.asarray(gx), want_x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), want_w, rtol=1e-4, atol=1e-4)
    runs = prof.measured("paged")
    assert runs and all(s.route == "triton-interpreter" for s in runs)
    by_src = [s for s in runs if s.module is not None and any(
        isinstance(op, TaskLaunchOp) for op in s.module.body.ops)]
    assert by_src
    if route == "device":
        assert rt.count(1) > 0 and rt.count(2) > 0 and not rt.buffers


@pytest.mark.parametrize("route", ["host", "device"])
def test_explain_and_the_task_ir_name_the_triton_route(stored, interpreter, monkeypatch,
                                                        route):
    path, mem, x, b, w = stored
    if route == "device":
        _install(monkeypatch)
    args = call(tg.Graph.open(path), x, b, w)
    with tg.scope(page_rows=100):
        ex = Mix().explain(**args)
        module = parse_task(Mix().ir("task", **args))
        with tg.profile() as prof:
            Mix()(**args)
    ((r, why),) = [(r, why) for r, _, why in ex.routes if r == "triton-interpreter"]
    assert why.startswith("3 page(s) of 100 destination rows") and ex.route == r
    assert "run the triton-interpreter kernel (rendered once for every page" in why
    kernel = next(op for op in next(op for op in module.body.ops if isinstance(
        op, TaskLaunchOp)).body.ops if isinstance(op, LaunchOp))
    assert kernel.schedule.target == "triton"
    assert 'target = "triton"' in ex.schedule and "once per page (3 page(s))" in ex.schedule
    assert str(prof.measured("paged")[-1].module) == str(module)     # the plan that ran
    moved = [op for op in module.body.ops if isinstance(op, TransferOp) and
             "device" in (op.src_tier, op.dst_tier)]
    if route == "host":
        assert not moved and "on the host page buffers (no device tier here" in why
        assert "device" not in ex.tasks
    else:
        assert "copied host -> device through the device tier" in why
        assert "3 page host -> device" not in ex.tasks     # (counted per page and field)
        assert f"{3 * 4} page host -> device" in ex.tasks and \
            "double-buffered" in ex.tasks and "3 write device -> host" in ex.tasks
        assert _double_buffered(module) == 3
        after = Mix().explain(run=True, **args)
        assert "kernels on triton-interpreter, copied host -> device " in str(after)


class Scaled(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge, scale):
        return src.x * scale


def test_device_route_parameters_all_edges_and_split_rows(tmp_path, stand_in):
    """Forward and gradient of a max with a parameter: the parameter copied to the device
    once, its cotangent a sum over all edges (per-row partials back from the device, added
    over pages), the source cotangent over the transposed relation; one row of 200
    neighbours runs the split kernels (split_degree 128) inside its page."""
    from tiga.testing import reference_grad
    n = 48
    deg = np.full(n, 3)
    deg[7] = 200
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    ci = np.random.default_rng(2).integers(0, n, rp[-1]).astype(np.int32)
    with tg.store.create(tmp_path / "s", num_src=n, num_dst=n, overwrite=True) as wr:
        wr.append_csr_chunk(rp, ci)
    x = np.random.default_rng(3).normal(size=(n, 2)).astype(np.float32)
    scale = np.array([0.5, 2.0], np.float32)

    def loss(graph):
        return lambda x, scale: tg.math.sum(Scaled()(graph=graph, src={"x": x},
                                                     scale=scale) ** 2)
    mem = tg.Graph.from_csr(rp, ci, num_src=n)
    with tg.scope(page_rows=16), tg.profile() as prof:
        y = Scaled()(graph=tg.Graph.open(tmp_path / "s"), src={"x": x}, scale=scale)
        got = tg.grad(loss(tg.Graph.open(tmp_path / "s")), argnums=(0, 1))(x, scale)
    np.testing.assert_allclose(np.asarray(y), np.asarray(Scaled().reference(
        graph=mem, src={"x": x}, scale=scale)), rtol=1e-6)
    want = reference_grad(loss(mem), argnums=(0, 1))(x, scale)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    runs = prof.measured("paged")
    kinds = {op.kind for s in runs for op in s.module.body.ops if isinstance(op, TransferOp)
             and op.src_tier == "device"}
    assert kinds == {"write", "accumulate"} and COUNTERS["split_launches"] > 0
    assert not stand_in.buffers


def test_device_route_result_on_disk_past_the_host_budget(tmp_path, stand_in):
    rp = np.arange(2001, dtype=np.int64) * 4
    ci = ((np.arange(2000)[:, None] + np.arange(1, 5)) % 2000).reshape(-1).astype(np.int32)
    x = (np.arange(2000 * 8, dtype=np.float32).reshape(2000, 8) % 97) / 50
    with tg.store.create(tmp_path / "s", num_src=2000, num_dst=2000, overwrite=True) as wr:
        wr.append_csr_chunk(rp, ci)
        wr.append_field("x", x, role="src")
    want = np.asarray(Mix().reference(**call(tg.Graph.from_csr(rp, ci), x, x, np.ones(
        (8000, 1), np.float32))))
    with tg.scope(budgets={"host": "80KB"}, page_rows=250, spill_dir=tmp_path / "sp"):
        y = Mix()(**call(tg.Graph.open(tmp_path / "s"), tg.store.open(tmp_path / "s")["x"],
                         tg.asarray(x).to("disk"), np.ones((8000, 1), np.float32)))
        assert y.tier == "disk"
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    assert stand_in.count(2) == 8 and not stand_in.buffers


def test_the_gpu_checks_paged_row_runs_dry(tmp_path):
    """benchmarks/gpu_check.py's paged row end to end on CPU (GPU_CHECK_DRY: the interpreter,
    tiny sizes): paged, equal to the float64 oracle, reported in the table."""
    import json
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, GPU_CHECK_DRY="1", TRITON_INTERPRET="1",
               TIGA_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_check.py"), "--out",
                           str(tmp_path), "--only", "paged-fwd"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads((tmp_path / "gpu-check.json").read_text())["rows"]
    assert row["status"] == "ok" and row["pages"] == 4 and row["route"] == "triton-interpreter"
    assert row["max_abs_diff"] <= 1e-5 * row["scale"] and row["tiga_ms"] > 0
    assert "| paged-fwd |" in (tmp_path / "gpu-check.md").read_text()


@pytest.mark.parametrize("route", ["host", "device"])
def test_fields_over_the_host_budget_page_on_the_triton_route(tmp_path, interpreter,
                                                              monkeypatch, route):
    """A relation held in memory whose disk-tier fields and result exceed the host budget
    runs by pages (resident_pages) on the selected Triton backend too."""
    if route == "device":
        rt = _install(monkeypatch)
    n = 1000
    rp = np.arange(n + 1, dtype=np.int64) * 4
    ci = ((np.arange(n)[:, None] + np.arange(1, 5)) % n).reshape(-1).astype(np.int32)
    x = np.random.default_rng(7).normal(size=(n, 16)).astype(np.float32)
    g = tg.Graph.from_csr(rp, ci)
    want = np.asarray(Mix().reference(**call(g, x, x, np.ones((4 * n, 1), np.float32))))
    with tg.scope(spill_dir=tmp_path):
        xd = tg.asarray(x).to("disk")
    with tg.scope(budgets={"host": "60KB"}, page_rows=250, spill_dir=tmp_path), \
            tg.profile() as prof:
        y = Mix()(**call(g, xd, x, np.ones((4 * n, 1), np.float32)))
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    (stats,) = prof.measured("paged")
    assert stats.pages == 4 and stats.route == "triton-interpreter"
    assert bool(stats.bytes_device["to"]) == (route == "device")
    if route == "device":
        assert rt.count(2) == 4 and not rt.buffers
