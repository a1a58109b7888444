"""tg.nn's layer classes load with torch on first use: `import tiga` stays torch-free, a
layer without torch raises a clear UnsupportedError, and tg.nn.trace is unchanged."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tiga as tg

REPO = Path(__file__).resolve().parents[2]

NO_TORCH = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test (import of {name!r})")
            return None

    sys.meta_path.insert(0, BlockTorch())
    import tiga as tg
    assert "torch" not in sys.modules
    assert callable(tg.nn.trace) and "GCNConv" in dir(tg.nn)
    for name in tg.nn.LAYERS:
        try:
            getattr(tg.nn, name)
        except tg.UnsupportedError as exc:
            assert f"tg.nn.{name} needs PyTorch" in str(exc), exc
        else:
            raise AssertionError(f"tg.nn.{name} loaded without torch")
    try:
        tg.nn.trace(object())
    except tg.UnsupportedError as exc:
        assert "tg.nn.trace needs PyTorch" in str(exc)
    assert "torch" not in sys.modules
    print("ok")
    """
)


def test_layers_without_torch_raise_a_clear_error():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", NO_TORCH], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_layers_load_from_the_torch_bridge():
    pytest.importorskip("torch")
    from tiga.torch_bridge import layers

    for name in tg.nn.LAYERS:
        assert getattr(tg.nn, name) is getattr(layers, name)
    assert set(tg.nn.__all__) == {"trace", "LayerArgumentError", *tg.nn.LAYERS, *tg.nn.AGGREGATIONS,
                                  *tg.nn.FUNCTIONS}
    with pytest.raises(AttributeError, match="module 'tiga.nn' has no attribute 'GCN'"):
        tg.nn.GCN    # noqa: B018


def test_reset_parameters_redraws_every_parameter():
    """As PyG's: weights redrawn, GCN/GAT biases zero, GIN's eps back to its initial value."""
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear
    layers = [tg.nn.GCNConv(3, 2), tg.nn.SAGEConv(3, 2, project=True),
              tg.nn.GATConv(3, 2, heads=2, edge_dim=2, residual=True),
              tg.nn.GATConv((3, 4), 2), tg.nn.GATv2Conv(3, 2, share_weights=True),
              tg.nn.GINConv(torch.nn.Sequential(lin(3, 3)), eps=0.25, train_eps=True),
              tg.nn.EdgeConv(lin(6, 2)), tg.nn.DynamicEdgeConv(lin(6, 2), 2)]
    for layer in layers:
        with torch.no_grad():
            for p in layer.parameters():
                p.fill_(7.0)
        layer.reset_parameters()
        for name, p in layer.named_parameters():
            if name == "eps":
                assert float(p.detach()) == 0.25
            elif name == "bias" and not isinstance(layer, tg.nn.SAGEConv):
                assert not p.detach().any(), (type(layer).__name__, name)
            else:
                assert not (p.detach() == 7.0).any(), (type(layer).__name__, name)
