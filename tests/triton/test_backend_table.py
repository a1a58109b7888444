"""Backend selection, explain() and program.ir("triton") for the Triton backends."""
import numpy as np
import pytest

import tiga as tg
from tiga.lower.backends import BACKENDS, selected_backend

G = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
X = np.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
W = np.array([4.0, 5.0, 2.0])


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def kwargs():
    return dict(graph=G, src={"x": X}, dst={}, edge={"w": W})


def test_table_lists_every_backend_with_renderer():
    assert set(BACKENDS) == {"cpu-llvm", "triton", "triton-interpreter"}
    for b in BACKENDS.values():
        assert callable(b.render)


def test_ir_triton_prints_the_kernel_source_that_runs():
    text = WeightedSum().ir("triton", **kwargs())
    assert "@triton.jit" in text and "for start in range(e0, e1, BLOCK_N):" in text
    compile(text, "<triton>", "exec")          # valid Python


def test_explain_reports_interpreter_route_and_schedule(interpreter):
    text = str(WeightedSum().explain(**kwargs()))
    assert "route:      triton-interpreter" in text
    assert "block_rows=" in text and "num_warps=" in text and "num_stages=" in text


def test_env_selects_backend(monkeypatch):
    monkeypatch.setenv("TIGA_BACKEND", "triton-interpreter")
    old = tg.config._backend
    tg.config.backend = None
    try:
        assert selected_backend() == "triton-interpreter"
        monkeypatch.setenv("TIGA_BACKEND", "nope")
        with pytest.raises(tg.UnsupportedError, match="TIGA_BACKEND: unknown backend 'nope'"):
            selected_backend()
    finally:
        tg.config.backend = old


def test_unavailable_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: (False, "no CUDA device"))
    old = tg.config._backend
    tg.config.backend = "triton"
    try:
        with pytest.raises(tg.UnsupportedError, match="backend 'triton' is unavailable: no CUDA"):
            WeightedSum()(**kwargs())
    finally:
        tg.config.backend = old


def test_unrendered_edge_function_falls_back_and_strict_refuses(interpreter):
    class Sliced(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x[:2] * edge.w          # slice: no Triton rendering yet

    with pytest.raises(tg.UnsupportedError, match="strict mode"):
        Sliced()(**kwargs())
    tg.config.strict = False
    got = np.asarray(Sliced()(**kwargs()))
    np.testing.assert_allclose(got, np.asarray(Sliced().reference(**kwargs())))
