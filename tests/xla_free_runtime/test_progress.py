"""Progress bars of ingest, transposed-relation builds and paged runs (issue 26 item 5): each
long operation ends its bar at total/total and leaves it on screen; the delay hides bars of
short work; tg.config.progress turns them off; Ctrl-C leaves the bar at the count reached.
The bars are read off the captured stderr stream (what tqdm drew last, per bar)."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.paging import handlers
from tiga.xla_free_runtime.reports import progress

pytest.importorskip("zarr", minversion="3.1")
pytest.importorskip("tqdm")

N, DEG, PAGE = 3000, 3, 256


class Twice(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * 2.0


class Captured:
    """What the bars drew on the captured stderr (pytest swaps sys.stderr per test phase,
    and the bars draw on the sys.stderr of their time)."""

    def __init__(self, capsys):
        self.capsys, self.text = capsys, ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text

    def truncate(self, _=0) -> None:
        self.capsys.readouterr()
        self.text = ""


@pytest.fixture()
def stderr(monkeypatch, capsys):
    """Bars shown at once, drawn into the captured stderr."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(tg.config, "progress", True)
    return Captured(capsys)


def make(path):
    ci = np.random.default_rng(0).integers(0, N, N * DEG)
    with tg.store.create(path, num_src=N, num_dst=N, overwrite=True) as w:
        for a in range(0, N, 1000):
            w.append_csr_chunk(np.arange(1001) * DEG, ci[a * DEG:(a + 1000) * DEG])
            w.append_field("x", np.arange(a, a + 1000, dtype=np.float64)[:, None], role="src")
    return ci


def bars(text: str) -> dict:
    """{description: [(n, total) of each bar, as last drawn]}: a bar is drawn over itself
    with carriage returns and ends with a newline when it is left on screen."""
    out: dict = {}
    for line in text.split("\n"):
        last = [seg for seg in line.split("\r") if seg.strip()]
        if not last:
            continue
        m = re.match(r"\s*(.+?): .*?(\d+)/(\d+) ", last[-1])
        assert m, f"unreadable bar {last[-1]!r}"
        out.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3))))
    return out


def test_ingest_transpose_and_paged_runs_end_at_total(tmp_path, stderr):
    ci = make(tmp_path / "s")
    g, store = tg.Graph.open(tmp_path / "s"), tg.store.open(tmp_path / "s")
    with tg.scope(page_rows=PAGE):
        y = Twice()(graph=g, src={"x": store["x"]})
        dx = tg.grad(lambda x: tg.math.sum(Twice()(graph=g, src={"x": x})))(store["x"])
    x = np.arange(N, dtype=np.float64)[:, None]      # oracle: numpy on the same CSR
    np.testing.assert_allclose(np.asarray(y), 2.0 * x[ci].reshape(N, DEG, 1).sum(1))
    np.testing.assert_allclose(np.asarray(dx)[:, 0], 2.0 * np.bincount(ci, minlength=N))
    got = bars(stderr.getvalue())
    assert got["tg.store ingest"] == [(N, N)]
    assert got["tg.store transpose (3 passes)"] == [(3 * N * DEG, 3 * N * DEG)]
    pages = -(-N // PAGE)
    # the forward, then the gradient's run over the transposed relation
    assert got["tg paged run"] == [(pages, pages), (pages, pages)]
    assert stderr.getvalue().endswith("\n")          # left on screen, the cursor below


def test_short_work_and_progress_off_draw_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tg.config, "progress", True)
    make(tmp_path / "a")             # well under the delay: no bar
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(tg.config, "progress", False)
    make(tmp_path / "b")
    assert capsys.readouterr().err == ""


def test_ctrl_c_stops_the_run_and_leaves_the_bar_where_it_stopped(tmp_path, stderr,
                                                                 monkeypatch):
    make(tmp_path / "s")
    g, store = tg.Graph.open(tmp_path / "s"), tg.store.open(tmp_path / "s")
    compute, seen = handlers.PagedRun.compute, []

    def interrupted(self, op):
        if len(seen) == 3:
            raise KeyboardInterrupt
        seen.append(op.page)
        return compute(self, op)
    monkeypatch.setattr(handlers.PagedRun, "compute", interrupted)
    stderr.truncate(0)
    with tg.scope(page_rows=PAGE), pytest.raises(KeyboardInterrupt):
        Twice()(graph=g, src={"x": store["x"]})
    assert bars(stderr.getvalue())["tg paged run"] == [(3, -(-N // PAGE))]
    assert not [t for t in threading.enumerate() if t.name.startswith("tiga-page-")]
