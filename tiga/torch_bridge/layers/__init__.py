"""torch_bridge: the tg.nn layer zoo (API.md section 12): PyG's message-passing layers as
torch modules whose aggregations run in Tiga, loading PyG's state dicts as they are."""
from __future__ import annotations

from .common import LayerArgumentError
from .edge_conv import DynamicEdgeConv, EdgeConv
from .gat_conv import GATConv, GATv2Conv
from .gcn import GCNConv
from .sage_gin import GINConv, SAGEConv

__all__ = ["DynamicEdgeConv", "EdgeConv", "GATConv", "GATv2Conv", "GCNConv", "GINConv",
           "LayerArgumentError", "SAGEConv"]
