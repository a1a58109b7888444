"""kNN on the Triton backends through cell shells of a directory built on the device: the
neighbour lists `knn_shells` writes (under Triton's interpreter) equal the reference's
exact lists (core.graph_generated.knn_csr: nearest first, ties by the smaller index), over
random point sets with duplicates (ties), far outliers (uneven cells), query sets, loops,
1..3 dims and float32/float64 coordinates."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.core import graph_generated as geo
from tiga.xla_free_runtime.backends.triton import generated as triton_generated
from tiga.xla_free_runtime.reports.runs import COUNTERS


@st.composite
def point_sets(draw):
    dims = draw(st.integers(1, 3))
    n = draw(st.integers(2, 14))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    pos = np.round(rng.random((n, dims)) * 4) / 4          # lattice values: many ties
    if draw(st.booleans()):
        pos[0] = pos[0] + 9.0                               # an outlier: sparse far cells
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    query = None
    if draw(st.booleans()):
        query = (rng.random((draw(st.integers(1, 6)), dims)) * 5 - 0.5).astype(dtype)
    loop = draw(st.booleans())
    same_excl = query is None and not loop
    k = draw(st.integers(1, min(4, n - (1 if same_excl else 0))))
    return pos.astype(dtype), query, k, loop


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=point_sets())
def test_shell_lists_equal_reference(interpreter, case):
    pos, query, k, loop = case
    g = tg.Graph.knn(pos, k, query=query, loop=loop)
    before = COUNTERS["knn_shell_walks"]
    walk = triton_generated.generated_walk(g, ("csr",), "cpu")
    assert COUNTERS["knn_shell_walks"] == before + 1
    _, want = geo.knn_csr(pos, query, k, loop)
    got = walk["col_idx"].numpy()[:len(want)]
    np.testing.assert_array_equal(got, want)


def test_shells_in_a_propagate_match_reference(interpreter):
    rng = np.random.default_rng(7)
    pos = rng.random((40, 2))
    x = rng.standard_normal((40, 3))
    g = tg.Graph.knn(pos, 6)

    class Near(tg.MessagePassing):
        reducer = tg.max()

        def edge(self, src, dst, edge):
            return src.x * tg.math.exp(-edge.distance)[..., None]

    kw = dict(graph=g, src={"x": x}, dst={}, edge={})
    np.testing.assert_allclose(np.asarray(Near()(**kw)), np.asarray(Near().reference(**kw)),
                               rtol=1e-12, atol=1e-12)
    assert triton_generated.knn_cell_width(pos, 6) > 0
