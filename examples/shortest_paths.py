"""Example: single-source shortest paths with predecessors (Bellman-Ford), checked against
scipy.sparse.csgraph and networkx.

Each sweep relaxes every edge u -> v at once. Two reducers read the same message
`dist[u] + w(u, v)` per destination: `tg.min(empty=inf)` gives the best candidate distance (a
node nobody links to gets inf, not 0) and `tg.argmin()` the source that offers it (ties go to
the smaller source id; -1 for a node without in-links). A node takes the candidate when it is
shorter than its distance so far. The sweeps stop when nothing changes (at most n - 1).

    .venv/bin/python examples/shortest_paths.py
"""
from __future__ import annotations

import math

import numpy as np

import tiga as tg


class BestDistance(tg.MessagePassing):
    reducer = tg.min(empty=math.inf)

    def edge(self, src, dst, edge):
        return src.dist + edge.weight


class BestPredecessor(BestDistance):
    reducer = tg.argmin()     # the source id whose message is the smallest


def shortest_paths(graph: tg.Graph, weight: np.ndarray, source: int):
    """(dist, pred, sweeps): distances from `source` (inf: unreachable) and each node's
    predecessor on a shortest path (-1 for the source and unreachable nodes)."""
    n = graph.num_dst
    best, pred_of = BestDistance(), BestPredecessor()

    @tg.jit
    def sweep(dist, pred):
        fields = dict(graph=graph, src={"dist": dist}, edge={"weight": weight})
        offer, by = best(**fields), pred_of(**fields)
        better = offer < dist
        return (tg.math.where(better, offer, dist), tg.math.where(better, by, pred),
                better.astype(tg.int64).sum())

    dist = np.full(n, np.inf)
    dist[source] = 0.0
    pred = np.full(n, -1, np.int64)
    for sweeps in range(1, n + 1):  # noqa: B007  (returned: the sweeps run)
        dist, pred, changed = sweep(dist, pred)
        if int(np.asarray(changed)) == 0:
            break
    return np.asarray(dist), np.asarray(pred), sweeps


def random_roads(n: int = 400, seed: int = 1):
    """A sparse directed graph with positive float weights (unique shortest paths) and
    nodes the source cannot reach."""
    rng = np.random.default_rng(seed)
    m = 3 * n
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    pairs = np.unique(np.stack([src[keep], dst[keep]], 1), axis=0)   # no duplicate edges
    return pairs[:, 0], pairs[:, 1], rng.uniform(0.1, 10.0, len(pairs))


def main(n: int = 400, source: int | None = None, verbose: bool = True) -> dict:
    import networkx as nx
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    src, dst, w = random_roads(n)
    if source is None:   # the node with the most out-links
        source = int(np.bincount(src, minlength=n).argmax())
    graph = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    dist, pred, sweeps = shortest_paths(graph, w, source)

    # scipy: rows are sources in its adjacency matrix; unreachable predecessors are -9999
    want_d, want_p = shortest_path(csr_matrix((w, (src, dst)), shape=(n, n)), method="D",
                                   indices=source, return_predecessors=True)
    want_p = np.where(want_p < 0, -1, want_p)
    np.testing.assert_allclose(dist, want_d, rtol=1e-12)
    np.testing.assert_array_equal(pred, want_p)
    web = nx.DiGraph()
    web.add_weighted_edges_from(zip(src.tolist(), dst.tolist(), w.tolist()))
    nx_d = nx.single_source_dijkstra_path_length(web, source)
    assert set(nx_d) == set(np.flatnonzero(np.isfinite(dist)).tolist())
    assert max(abs(nx_d[v] - dist[v]) for v in nx_d) < 1e-9
    reachable = int(np.isfinite(dist).sum())
    far = int(np.argmax(np.where(np.isfinite(dist), dist, -1)))
    path = [far]
    while pred[path[-1]] >= 0:
        path.append(int(pred[path[-1]]))
    if verbose:
        print(f"shortest paths: {n} nodes, {graph.num_edges} edges, {reachable} reached in "
              f"{sweeps} sweeps (max {dist[far]:.2f}); as scipy and networkx")
    return {"sweeps": sweeps, "reachable": reachable, "path": path[::-1]}


if __name__ == "__main__":
    main()
