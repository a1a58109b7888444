"""tg.nn: torch.nn capture (`trace`), the layer zoo (GCNConv, SAGEConv, GATConv, GATv2Conv,
GINConv, GINEConv, EdgeConv, DynamicEdgeConv, and GraphConv, SGConv, APPNP, TAGConv,
ChebConv, ResGatedGraphConv, GCN2Conv, TransformerConv, NNConv, PNAConv, RGCNConv,
PointNetConv, GENConv: API.md section 12) and the aggregations
(`tg.nn.aggr`, also importable from here as PyG's torch_geometric.nn exports them).

Torch-free on import: `trace` reaches the torch bridge (the only layer that imports torch)
when it is called, and the layer and aggregation classes are looked up in
tiga.torch_bridge.layers on first access (module __getattr__), so `import tiga` keeps
working without torch.
"""
from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from .core import graph_batch  # noqa: F401  (attaches tg.Graph.batch: batches of small graphs)
from .core.errors import LayerArgumentError, UnsupportedError

if TYPE_CHECKING:   # what __getattr__ hands out, for static tools (mkdocstrings)
    from .torch_bridge.layers import (  # noqa: F401
        APPNP,
        Aggregation,
        ChebConv,
        DegreeScalerAggregation,
        DynamicEdgeConv,
        EdgeConv,
        FastRGCNConv,
        GATConv,
        GATv2Conv,
        GCN2Conv,
        GCNConv,
        GENConv,
        GINConv,
        GINEConv,
        GraphConv,
        LSTMAggregation,
        MaxAggregation,
        MeanAggregation,
        MessageNorm,
        MinAggregation,
        MLPAggregation,
        MulAggregation,
        MultiAggregation,
        NeighborLoader,
        NNConv,
        PNAConv,
        PointNetConv,
        PowerMeanAggregation,
        ResGatedGraphConv,
        RGCNConv,
        SAGEConv,
        SGConv,
        SoftmaxAggregation,
        StdAggregation,
        SumAggregation,
        TAGConv,
        TransformerConv,
        VarAggregation,
        gcn_norm,
        global_add_pool,
        global_max_pool,
        global_mean_pool,
        global_softmax_pool,
    )

LAYERS = ("GCNConv", "SAGEConv", "GATConv", "GATv2Conv", "GINConv", "GINEConv", "EdgeConv",
          "DynamicEdgeConv", "GraphConv", "SGConv", "APPNP", "TAGConv", "ChebConv",
          "ResGatedGraphConv", "GCN2Conv", "TransformerConv", "NNConv", "PointNetConv",
          "RGCNConv", "FastRGCNConv", "PNAConv", "GENConv", "MessageNorm")
# PyG's torch_geometric.nn exports these too (from torch_geometric.nn import MLPAggregation)
AGGREGATIONS = ("Aggregation", "SumAggregation", "MeanAggregation", "MaxAggregation",
                "MinAggregation", "MulAggregation", "VarAggregation", "StdAggregation",
                "SoftmaxAggregation", "PowerMeanAggregation", "MultiAggregation",
                "LSTMAggregation", "MLPAggregation", "DegreeScalerAggregation")
FUNCTIONS = ("gcn_norm", "global_add_pool", "global_mean_pool", "global_max_pool",
             "global_softmax_pool")
FUNCTIONS = (*FUNCTIONS, "NeighborLoader")   # neighbour-sampled mini-batches (API.md section 12)


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
    """The layer and aggregation classes, imported with torch on first use."""
    if name not in LAYERS + AGGREGATIONS + FUNCTIONS:
        raise AttributeError(f"module 'tiga.nn' has no attribute {name!r}")
    try:
        from .torch_bridge import layers
    except ImportError as exc:  # torch is not installed
        raise _needs_torch(f"tg.nn.{name}", exc) from exc
    return getattr(layers, name)


def __dir__() -> list[str]:
    return sorted(__all__ + ["aggr"])


AGGR_DOC = """tg.nn.aggr: PyG's aggregations (`from tiga.nn.aggr import SoftmaxAggregation`), the
modules the layers' `aggr=` takes by name, as a list or as a module (API.md section 12).

Sum, Mean, Max, Min, Mul, Var, Std, Softmax (learnable temperature), PowerMean: each one
Tiga propagate (forward and backward compiled); MultiAggregation combines several;
LSTMAggregation and MLPAggregation (order-dependent, as PyG's) run densely in torch.
DegreeScalerAggregation (PNAConv's: aggregators times in-degree scalers) reduces with the
fused ones and scales in torch.
`resolve(name_or_list_or_module, **kwargs)` gives the module a layer's `aggr=` means.
Torch-free on import, as tg.nn: the classes load with torch on first access.
"""


def _aggr_module() -> types.ModuleType:
    """tg.nn.aggr: a module object registered as `tiga.nn.aggr` (tg.nn is a module, and
    DESIGN.md's layering has no tiga/nn package), so that `import tiga.nn.aggr` and
    `from tiga.nn.aggr import ...` work as PyG users write them."""
    module = types.ModuleType("tiga.nn.aggr", AGGR_DOC)
    names = list(AGGREGATIONS) + ["resolve"]

    def getattr_(name: str):
        if name not in names:
            raise AttributeError(f"module 'tiga.nn.aggr' has no attribute {name!r}")
        try:
            from .torch_bridge import layers
        except ImportError as exc:  # torch is not installed
            raise _needs_torch(f"tg.nn.aggr.{name}", exc) from exc
        # DegreeScalerAggregation lives beside PNAConv (pna.py), the others in aggr.py
        return getattr(layers.aggr if name == "resolve" else layers, name)

    module.__getattr__ = getattr_
    module.__dir__ = lambda: sorted(names)
    module.__all__ = names
    return module


aggr = sys.modules.setdefault("tiga.nn.aggr", _aggr_module())


__all__ = ["trace", *LAYERS, *AGGREGATIONS, *FUNCTIONS, "LayerArgumentError"]
