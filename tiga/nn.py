"""tg.nn: torch.nn capture (`trace`) and the layer zoo (GCNConv, SAGEConv, GATConv, GATv2Conv,
GINConv, EdgeConv, DynamicEdgeConv: API.md section 12).

Torch-free on import: `trace` reaches the torch bridge (the only layer that imports torch)
when it is called, and the layer classes are looked up in tiga.torch_bridge.layers on first
access (module __getattr__), so `import tiga` keeps working without torch.
"""
from __future__ import annotations

from .core.errors import UnsupportedError

LAYERS = ("GCNConv", "SAGEConv", "GATConv", "GATv2Conv", "GINConv", "EdgeConv",
          "DynamicEdgeConv")


def _needs_torch(what: str, exc: ImportError) -> UnsupportedError:
    return UnsupportedError(f"{what} needs PyTorch ({exc})",
                            hint="pip install torch==2.13.0, or write the edge function "
                                 "with tg.math")


def trace(module):
    """A callable that evaluates `module` on traced rows inside edge and update functions.

    Supported: Sequential of Linear, ReLU, LeakyReLU, ELU, Softplus, GELU, SiLU, Tanh,
    Sigmoid, Identity, Dropout (in eval mode), LayerNorm, PyG's torch_geometric.nn.Linear,
    and subclasses of these that keep their base class's forward. Several inputs are
    concatenated on the feature (last) axis. The
    module's parameters stay live torch Parameters: each call reads their current values
    (an optimizer step is seen by the next call) and torch.autograd receives their gradients.
    """
    try:
        from .torch_bridge.nn import trace_module
    except ImportError as exc:  # torch is not installed
        raise _needs_torch("tg.nn.trace", exc) from exc
    return trace_module(module)


def __getattr__(name: str):
    """The layer classes, imported with torch on first use."""
    if name not in LAYERS:
        raise AttributeError(f"module 'tiga.nn' has no attribute {name!r}")
    try:
        from .torch_bridge import layers
    except ImportError as exc:  # torch is not installed
        raise _needs_torch(f"tg.nn.{name}", exc) from exc
    return getattr(layers, name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["trace", *LAYERS]
