"""examples/pagerank.py, shortest_paths.py and connected_components.py: each runs as written
and checks itself against networkx and scipy.sparse.csgraph (the assertions live in the
example, so a wrong answer fails here); each prints one short summary line."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("networkx")
pytest.importorskip("scipy")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, starts", [
    ("pagerank", "pagerank: 300 pages"),
    ("shortest_paths", "shortest paths: 400 nodes"),
    ("connected_components", "connected components: 500 nodes"),
])
def test_example_runs_checks_itself_and_prints_one_line(name, starts, capsys):
    result = load(name).main()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(starts), out
    assert "networkx" in out[0]
    assert result


def test_shortest_paths_follow_predecessors_back_to_the_source():
    import numpy as np

    ex = load("shortest_paths")
    src, dst, w = ex.random_roads(60, seed=3)
    graph = ex.tg.Graph.from_coo(src, dst, num_src=60, num_dst=60)
    source = int(np.bincount(src, minlength=60).argmax())
    dist, pred, _ = ex.shortest_paths(graph, w, source)
    weight = {(int(a), int(b)): float(c) for a, b, c in zip(src, dst, w)}
    for v in np.flatnonzero(np.isfinite(dist)):
        if v == source:
            assert pred[v] == -1 and dist[v] == 0.0
            continue
        u = int(pred[v])   # the last edge of a shortest path: dist adds up exactly
        assert dist[v] == dist[u] + weight[(u, int(v))]
    assert (pred[~np.isfinite(dist)] == -1).all()
