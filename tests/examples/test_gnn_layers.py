"""examples/gnn_layers.py: every layer matches a dense torch formula and, when
torch_geometric is installed, PyG's own layer (forward and gradients, float64); the
two-layer models train on the karate club; the embedded karate data matches networkx and
PyG's KarateClub."""
from __future__ import annotations

import builtins
import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "gnn_layers.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("gnn_layers_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(example):
    return example.main(epochs=40, verbose=False)


def _pyg_installed() -> bool:
    return importlib.util.find_spec("torch_geometric") is not None


def _check_oracle(results, oracle):
    checks = results["checks"]
    assert set(checks) == {"GCN", "GraphSAGE", "GAT (1 head)", "GAT (2 heads)", "GIN"}
    for name, diffs in checks.items():
        assert set(diffs) == ({"dense torch", "PyG"} if _pyg_installed() else {"dense torch"})
        forward, grads = diffs[oracle]
        assert forward < 1e-10 and grads < 1e-10, (name, oracle, forward, grads)


def test_every_layer_matches_the_dense_torch_oracle(results):
    _check_oracle(results, "dense torch")


def test_every_layer_matches_pyg(results):
    pytest.importorskip("torch_geometric", reason="torch_geometric (the PyG oracle) is not "
                        "installed: the dense-torch oracle test still ran")
    _check_oracle(results, "PyG")


def test_training_lowers_the_loss(results):
    assert set(results["train"]) == {"GCN", "GraphSAGE", "GAT", "GIN"}
    for name, r in results["train"].items():
        assert r["loss"] < 0.5 * r["first_loss"], (name, r)
        assert r["accuracy"] > 0.5, (name, r)


def test_embedded_karate_club_matches_networkx_and_pyg(example, monkeypatch):
    real_import = builtins.__import__

    def no_networkx(name, *args, **kwargs):
        if name == "networkx":
            raise ImportError("networkx hidden by the test")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_networkx)
    embedded = example.karate_club()
    monkeypatch.undo()
    assert embedded[0].shape == (2, 156) and embedded[1].sum() == 17
    edges = {tuple(e) for e in embedded[0].T}
    assert len(edges) == 156 and all((b, a) in edges for a, b in edges)
    nx = pytest.importorskip("networkx")
    from_nx = example.karate_club()
    np.testing.assert_array_equal(from_nx[0], embedded[0])
    np.testing.assert_array_equal(from_nx[1], embedded[1])
    g = nx.karate_club_graph()
    assert g.number_of_edges() == 78


def test_embedded_karate_club_matches_pyg(example):
    datasets = pytest.importorskip("torch_geometric.datasets",
                                   reason="torch_geometric is not installed")
    edges = {tuple(e) for e in example.karate_club()[0].T}
    pyg_edges = {tuple(e) for e in datasets.KarateClub()[0].edge_index.numpy().T}
    assert pyg_edges == edges



def _readme_pyg_code() -> str:
    """The hand-written GCN of the user guide's "Coming from PyG" page."""
    text = (REPO / "docs" / "guide" / "from-pyg.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]
              if "class GCN(nn.Module)" in b]
    assert blocks, "the Coming from PyG page has no hand-written GCN block"
    return blocks[0]


def test_readme_gcn_runs_and_matches_the_dense_formula():
    scope: dict = {}
    exec(compile(_readme_pyg_code(), "from-pyg.md", "exec"), scope)
    conv, x, y, edge_index = scope["conv"], scope["x"], scope["y"], scope["edge_index"]
    assert x.grad is not None and conv.lin.weight.grad is not None
    a = torch.zeros(4, 4)
    a[edge_index[1], edge_index[0]] = 1.0
    a += torch.eye(4)
    d = a.sum(1).rsqrt()
    want = (d[:, None] * a * d[None, :]) @ conv.lin(x) + conv.bias
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)


def test_readme_gcn_matches_pyg():
    pyg_nn = pytest.importorskip("torch_geometric.nn", reason="torch_geometric is not installed")
    scope: dict = {}
    exec(compile(_readme_pyg_code(), "from-pyg.md", "exec"), scope)
    conv, x, y, edge_index = scope["conv"], scope["x"], scope["y"], scope["edge_index"]
    pyg = pyg_nn.GCNConv(8, 4)
    pyg.load_state_dict(conv.state_dict())
    torch.testing.assert_close(y, pyg(x, edge_index), rtol=1e-5, atol=1e-6)
