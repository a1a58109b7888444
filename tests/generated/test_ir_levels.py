"""Generated relations through the IR levels: the Iter IR names the cell-directory /
knn-shells hierarchy and every level's text parses back to the same module."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.lower import ir


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * (0.2 - edge.distance)


@pytest.mark.parametrize("kind, hierarchy", [("radius", "cell-directory"),
                                             ("knn", "knn-shells")])
@pytest.mark.parametrize("stage", ["iter", "kernel", "task"])
def test_ir_names_the_generated_hierarchy_and_round_trips(kind, hierarchy, stage):
    pos = np.random.default_rng(0).random((50, 3))
    g = tg.Graph.radius(pos, 0.2) if kind == "radius" else tg.Graph.knn(pos, 4)
    text = Weighted().ir(stage, graph=g, src={"x": np.ones((50, 1))})
    assert f'coordinate_hierarchy = "{hierarchy}"' in text
    module = ir.parse_module(text)
    assert ir.parse_module(str(module)) == module
