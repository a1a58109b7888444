"""tg.nn's mean over the sources (common.mean_of_sources: a sum scaled by the inverse
in-degree, whose VJP is one propagate) against a torch index_add oracle and finite
differences, on hostile relations: isolated nodes, duplicates, self edges, no edges,
bipartite, a tg.Graph.batch relation; other dtypes run the mean reducer."""
from __future__ import annotations

import pytest
import torch

import tiga as tg
from tiga.torch_bridge.layers.common import inverse_degrees, mean_of_sources, relation

GRAPHS = {
    "isolated": ([0, 1, 1, 2], [1, 2, 0, 1], 5, 5),
    "duplicates_and_loops": ([0, 0, 2, 2, 3, 3], [1, 1, 2, 2, 3, 0], 4, 4),
    "no_edges": ([], [], 3, 3),
    "bipartite": ([0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0], 6, 4),
}


def _oracle(src, dst, n_dst, x):
    total = x.new_zeros((n_dst,) + tuple(x.shape[1:])).index_add(0, dst, x[src])
    count = torch.bincount(dst, minlength=n_dst).clamp(min=1).to(x.dtype)
    return total / count.view((-1,) + (1,) * (x.dim() - 1))


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("shape", [(3,), (2, 3)])
def test_mean_matches_index_add_and_finite_differences(name, shape):
    s, d, n_src, n_dst = GRAPHS[name]
    src, dst = torch.tensor(s, dtype=torch.int64), torch.tensor(d, dtype=torch.int64)
    graph = relation("test", torch.stack([src, dst]), n_src, n_dst)
    x = torch.randn((n_src,) + shape, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(mean_of_sources(graph, x), _oracle(src, dst, n_dst, x),
                               rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda v: mean_of_sources(graph, v), (x,))


def test_mean_over_a_batch_relation_and_the_degree_memo():
    parts = [tg.Graph.from_coo([0, 1, 2], [1, 2, 1], num_src=3, num_dst=3),
             tg.Graph.from_coo([1, 0], [0, 0], num_src=2, num_dst=2)]
    batch = tg.Graph.batch(parts)
    x = torch.randn(5, 4, requires_grad=True)
    src = torch.tensor([0, 1, 2, 4, 3])
    dst = torch.tensor([1, 2, 1, 3, 3])
    got = mean_of_sources(batch, x)
    torch.testing.assert_close(got, _oracle(src, dst, 5, x))
    ct = torch.randn(5, 4)
    want_g, = torch.autograd.grad(_oracle(src, dst, 5, x), x, ct)
    got_g, = torch.autograd.grad(got, x, ct)
    torch.testing.assert_close(got_g, want_g)
    assert inverse_degrees(batch, torch.float32) is inverse_degrees(batch, torch.float32)
    torch.testing.assert_close(inverse_degrees(batch, torch.float32),
                               torch.tensor([1.0, 0.5, 1.0, 0.5, 1.0]))


def test_other_dtypes_run_the_mean_reducer():
    s, d, n_src, n_dst = GRAPHS["isolated"]
    src, dst = torch.tensor(s), torch.tensor(d)
    graph = relation("test", torch.stack([src, dst]), n_src, n_dst)
    x = torch.randn(n_src, 3).to(torch.bfloat16)
    want = _oracle(src, dst, n_dst, x.float())
    torch.testing.assert_close(mean_of_sources(graph, x).float(), want, rtol=2e-2, atol=2e-2)
