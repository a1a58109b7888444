"""torch_bridge: the tg.nn layer zoo (API.md section 12): PyG's message-passing layers as
torch modules whose aggregations run in Tiga, loading PyG's state dicts as they are, and
tg.nn.aggr's aggregations."""
from __future__ import annotations

from .aggr import (
    Aggregation,
    LSTMAggregation,
    MaxAggregation,
    MeanAggregation,
    MinAggregation,
    MLPAggregation,
    MulAggregation,
    MultiAggregation,
    PowerMeanAggregation,
    SoftmaxAggregation,
    StdAggregation,
    SumAggregation,
    VarAggregation,
)
from .cheb import ChebConv
from .common import LayerArgumentError
from .edge_conv import DynamicEdgeConv, EdgeConv
from .edge_nn import NNConv, PointNetConv
from .gat_conv import GATConv, GATv2Conv
from .gcn import GCNConv, gcn_norm
from .gen import GENConv, MessageNorm
from .graph_conv import GraphConv, ResGatedGraphConv
from .loader import NeighborLoader, SampledSubgraph
from .pna import DegreeScalerAggregation, PNAConv
from .pool import global_add_pool, global_max_pool, global_mean_pool, global_softmax_pool
from .propagation import APPNP, GCN2Conv, SGConv, TAGConv
from .rgcn import FastRGCNConv, RGCNConv
from .sage_gin import GINConv, GINEConv, SAGEConv
from .transformer import TransformerConv

__all__ = ["APPNP", "Aggregation", "ChebConv", "DynamicEdgeConv", "EdgeConv",
           "FastRGCNConv", "GATConv", "GATv2Conv", "GCN2Conv", "GCNConv", "GENConv",
           "GINConv", "GINEConv", "GraphConv", "LSTMAggregation", "LayerArgumentError",
           "MLPAggregation", "MaxAggregation", "MeanAggregation", "MessageNorm",
           "MinAggregation", "MulAggregation", "MultiAggregation", "NNConv", "PNAConv",
           "PointNetConv", "PowerMeanAggregation", "RGCNConv", "ResGatedGraphConv",
           "SAGEConv", "SGConv", "SoftmaxAggregation", "StdAggregation", "SumAggregation",
           "TAGConv", "TransformerConv", "VarAggregation", "gcn_norm", "global_add_pool",
           "global_max_pool", "global_mean_pool", "global_softmax_pool"]
__all__ += ["DegreeScalerAggregation", "NeighborLoader", "SampledSubgraph"]
