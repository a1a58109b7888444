"""program.ir("triton") of a propagate over a radius relation prints the cell walk the
runtime renders and launches (the same kernel text but for its name), and that kernel under
triton-interpreter matches the reference with and without self loops."""
import re

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime import triton_launch


class Geo(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return tg.math.exp(-edge.distance)[..., None] * src.x


def _kernels(text: str) -> str:
    """The kernel text with its function names replaced (they name the module)."""
    names = re.findall(r"^def (\w+)\(", text, re.M)
    for n in names:
        text = text.replace(n, "K")
    return text


@pytest.mark.parametrize("loop", [False, True])
def test_ir_prints_the_cell_walk_that_runs(interpreter, loop):
    rng = np.random.default_rng(5)
    pos = rng.random((30, 2))
    x = rng.standard_normal((30, 3))
    g = tg.Graph.radius(pos, 0.3, loop=loop)
    kw = dict(graph=g, src={"x": x}, dst={}, edge={})
    printed = Geo().ir("triton", **kw)
    assert "for cell in range(0, 9):" in printed and "cell_order" in printed
    before = set(triton_launch._SOURCES)
    got = np.asarray(Geo()(**kw))
    np.testing.assert_allclose(got, np.asarray(Geo().reference(**kw)), rtol=1e-12,
                               atol=1e-12)
    ran = [triton_launch._SOURCES[k] for k in set(triton_launch._SOURCES) - before] or \
        [s for s in triton_launch._SOURCES.values() if s.signature.relation == ("radius", 2)]
    assert any(_kernels(s.text) == _kernels(printed) for s in ran)
