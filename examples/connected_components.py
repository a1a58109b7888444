"""Example: connected components by label propagation, checked against
scipy.sparse.csgraph and networkx.

Every node starts with its own id as label and repeatedly takes the smallest label among
itself and its neighbours (`tg.min(empty=inf)`: an isolated node has no neighbour, and its
candidate must not be the default 0, which would merge it into component 0). When no label
changes, each component is labelled by its smallest node id.

    .venv/bin/python examples/connected_components.py
"""
from __future__ import annotations

import math

import numpy as np

import tiga as tg


class SmallestNeighbourLabel(tg.MessagePassing):
    reducer = tg.min(empty=math.inf)

    def edge(self, src, dst, edge):
        return src.label


def connected_components(graph: tg.Graph) -> tuple[np.ndarray, int]:
    """(label per node: the smallest node id of its component, sweeps run) of a symmetric
    relation (every edge present in both directions)."""
    layer = SmallestNeighbourLabel()

    @tg.jit
    def sweep(label):
        new = tg.math.minimum(label, layer(graph=graph, src={"label": label}))
        return new, (new < label).astype(tg.int64).sum()

    label = np.arange(graph.num_dst, dtype=np.float64)
    for sweeps in range(1, graph.num_dst + 2):  # noqa: B007  (returned: the sweeps run)
        label, changed = sweep(label)
        if int(np.asarray(changed)) == 0:
            break
    return np.asarray(label).astype(np.int64), sweeps


def random_forest_of_clusters(n: int = 500, seed: int = 2):
    """Undirected edges: random clusters (some split in pieces), a few bridges joining
    clusters, and isolated nodes."""
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, 40, n)
    cluster[rng.choice(n, 25, replace=False)] = -1            # isolated nodes
    edges = []
    for c in range(40):
        members = np.flatnonzero(cluster == c)
        if len(members) > 1:   # about one edge per member: some clusters stay in pieces
            edges.append(rng.choice(members, (len(members), 2)))
    bridges = rng.choice(np.flatnonzero(cluster >= 0), (6, 2))
    edges = np.concatenate(edges + [bridges])
    return edges[edges[:, 0] != edges[:, 1]]


def main(n: int = 500, verbose: bool = True) -> dict:
    import networkx as nx
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components as scipy_components

    edges = random_forest_of_clusters(n)
    src = np.concatenate([edges[:, 0], edges[:, 1]])          # both directions
    dst = np.concatenate([edges[:, 1], edges[:, 0]])
    graph = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    label, sweeps = connected_components(graph)

    count, want = scipy_components(coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)),
                                   directed=False)
    # the same partition: each scipy component maps to exactly one Tiga label and back
    pairs = set(zip(label.tolist(), want.tolist()))
    assert len(pairs) == count == len(set(label.tolist())), "components differ from scipy"
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges.tolist())
    nx_labels = {min(c): sorted(c) for c in nx.connected_components(g)}
    assert {int(k): np.flatnonzero(label == k).tolist() for k in set(label.tolist())} \
        == nx_labels, "components differ from networkx"
    sizes = np.bincount(label)
    sizes = np.sort(sizes[sizes > 0])[::-1]
    if verbose:
        print(f"connected components: {n} nodes, {count} components (largest {sizes[0]} "
              f"nodes) after {sweeps} sweeps; same as scipy and networkx")
    return {"components": count, "sweeps": sweeps}


if __name__ == "__main__":
    main()
