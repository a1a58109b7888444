"""torch_bridge: tg.nn.aggr, PyG's aggregation modules (`aggr=` of the layers, or called
on their own) with the reduction over each destination's edges run by Tiga.

An aggregation reduces source rows over a relation: `aggr.over(graph, x)` gives one row
per destination (x (S, ...) source rows; a row without edges gives 0). Called as PyG's,
`aggr(x, index, ptr=None, dim_size=None, dim=-2)` reduces the rows of x into the groups
`index` names (the relation row i -> index[i]). Sum, mean, max, min, mul, var and std are
one Tiga propagate each (var and std reduce [x, x*x] in one call); softmax is one
online-softmax propagate with the temperature t as an operand (learnable: Tiga's VJP gives
its gradient); powermean maps the rows in torch, takes a Tiga mean and maps back. LSTM and
MLP aggregations (PyG's, order-dependent) gather each destination's rows densely in torch.
"""
from __future__ import annotations

import copy

import torch

from ...core.graph import Graph
from ...core.reducers import online_softmax
from ...trace.message_passing import MessagePassing
from .common import LayerArgumentError, edge_index_like, mean_of_sources, source_reducer


class Aggregation(torch.nn.Module):
    """Base of the aggregations: `over(graph, x)` and PyG's `forward(x, index, ...)`."""

    def reset_parameters(self) -> None:
        pass

    def over(self, graph: Graph, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x, index=None, ptr=None, dim_size=None, dim: int = -2):
        """PyG's call: the rows of x along `dim` reduced into groups `index` (or the
        consecutive segments of `ptr`); dim_size groups (default: the largest id + 1)."""
        if index is None and ptr is None:
            raise LayerArgumentError(f"{type(self).__name__}: give index or ptr")
        moved = x.movedim(dim, 0)
        if index is None:
            counts = ptr.diff()
            index = torch.repeat_interleave(torch.arange(len(counts), device=x.device),
                                            counts)
            dim_size = len(counts) if dim_size is None else dim_size
        if dim_size is None:
            dim_size = int(index.max()) + 1 if index.numel() else 0
        rows = torch.arange(moved.size(0), device=index.device)
        graph = Graph.from_coo(rows.cpu().numpy(), index.detach().cpu().numpy(),
                               num_src=moved.size(0), num_dst=int(dim_size))
        return self.over(graph, moved).movedim(0, dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _Basic(Aggregation):
    """One Tiga reducer over the source rows."""

    name = "sum"

    def over(self, graph, x):
        if self.name == "mean":
            return mean_of_sources(graph, x)
        return source_reducer(self.name)(graph=graph, src={"x": x})


class SumAggregation(_Basic):
    """sum_j x_j per destination (PyG's "sum" / "add")."""

    name = "sum"


class MeanAggregation(_Basic):
    """mean_j x_j per destination (0 without edges)."""

    name = "mean"


class MaxAggregation(_Basic):
    """max_j x_j per feature (0 without edges, as PyG)."""

    name = "max"


class MinAggregation(_Basic):
    """min_j x_j per feature (0 without edges, as PyG)."""

    name = "min"


class MulAggregation(_Basic):
    """prod_j x_j per feature (PyG's "mul")."""

    name = "mul"


class VarAggregation(Aggregation):
    """mean(x^2) - mean(x)^2 per feature (PyG's formula; semi_grad=True stops the
    gradient through mean(x^2))."""

    def __init__(self, semi_grad: bool = False):
        super().__init__()
        self.semi_grad = semi_grad

    def over(self, graph, x):
        sq = x * x
        both = torch.cat([x, sq.detach() if self.semi_grad else sq], dim=-1)
        # (sum / degree exactly, as PyG: mean2 - mean^2 cancels, amplifying any rounding)
        mean, mean2 = source_reducer("mean")(graph=graph, src={"x": both}).chunk(2, dim=-1)
        return mean2 - mean * mean


class StdAggregation(Aggregation):
    """sqrt(var) as PyG's: var clamped at 1e-5 before the root, results at or below
    sqrt(1e-5) set to 0 (so an empty or constant neighbourhood gives 0, gradient 0)."""

    def __init__(self, semi_grad: bool = False):
        super().__init__()
        self.var_aggr = VarAggregation(semi_grad)

    def over(self, graph, x):
        out = self.var_aggr.over(graph, x).clamp(min=1e-5).sqrt()
        return out.masked_fill(out <= 1e-5 ** 0.5, 0.0)


class _SoftmaxMessages(MessagePassing):
    """sum_j softmax_j(t x_j) x_j per feature: online softmax, one head per feature."""

    def __init__(self):
        super().__init__()
        self.reducer = online_softmax()

    def edge(self, src, dst, edge, t):
        return self.reducer(src.x * t, src.v)


_SOFTMAX = _SoftmaxMessages()


class SoftmaxAggregation(Aggregation):
    """PyG's softmax aggregation: sum_j softmax over j of (t * x_j), times x_j, per
    feature; t a float, or a learned Parameter `t` of shape (channels,) with learn=True.
    semi_grad=True (fixed t only) gives the softmax weights no gradient, as PyG's."""

    def __init__(self, t: float = 1.0, learn: bool = False, semi_grad: bool = False,
                 channels: int = 1):
        super().__init__()
        if learn and semi_grad:
            raise LayerArgumentError("SoftmaxAggregation: cannot enable 'semi_grad' in "
                                     "case the temperature term 't' is learnable")
        if not learn and channels != 1:
            raise LayerArgumentError("SoftmaxAggregation: cannot set 'channels' greater "
                                     "than '1' in case it is not trainable")
        self._init_t, self.learn, self.semi_grad, self.channels = t, learn, semi_grad, channels
        self.t = torch.nn.Parameter(torch.empty(channels)) if learn else t
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if isinstance(self.t, torch.Tensor):
            with torch.no_grad():
                self.t.fill_(self._init_t)

    def over(self, graph, x):
        t = self.t
        if not isinstance(t, torch.Tensor):
            t = torch.tensor([float(t)], dtype=x.dtype, device=x.device)
        # semi_grad (PyG: the softmax weights computed without gradient): the scores read
        # a detached x, so the gradient reaches x through the weighted values alone
        scores = x.detach() if self.semi_grad else x
        out = _SOFTMAX(graph=graph, src={"x": scores, "v": x.unsqueeze(-1)}, t=t.to(x.dtype))
        return out.squeeze(-1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learn={self.learn})"


class PowerMeanAggregation(Aggregation):
    """PyG's power mean: (mean_j clamp(x_j)^p)^(1/p), both clamped to [clamp_min,
    clamp_max]; p a float or a learned Parameter `p` (learn=True)."""

    def __init__(self, p: float = 1.0, learn: bool = False, channels: int = 1,
                 clamp_min: float | None = 1e-4, clamp_max: float | None = 100.0):
        super().__init__()
        if not learn and channels != 1:
            raise LayerArgumentError("PowerMeanAggregation: cannot set 'channels' greater "
                                     "than '1' in case it is not trainable")
        self._init_p, self.learn, self.channels = p, learn, channels
        self.p = torch.nn.Parameter(torch.empty(channels)) if learn else p
        self.min_value, self.max_value = clamp_min, clamp_max
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if isinstance(self.p, torch.Tensor):
            with torch.no_grad():
                self.p.fill_(self._init_p)

    def over(self, graph, x):
        p = self.p
        plain = not isinstance(p, torch.Tensor) and p == 1
        if not plain:
            x = x.clamp(min=self.min_value, max=self.max_value).pow(p)
        out = source_reducer("mean")(graph=graph, src={"x": x})   # (exact: pow amplifies)
        if not plain:
            out = out.clamp(min=self.min_value, max=self.max_value).pow(1.0 / p)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learn={self.learn})"


# ---- order-dependent aggregations: dense per destination, in torch ----------------------------

def dense_rows(graph: Graph, x, max_num_elements=None, name: str = "") -> torch.Tensor:
    """(num_dst, K, ...) of each destination's source rows in edge order, zero-padded
    (PyG's to_dense_batch); the edges must come sorted by destination, as PyG asks."""
    ei = edge_index_like(graph, x)
    dst = ei[1]
    if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
        raise LayerArgumentError(
            f"{name}: can only operate on 'index' tensor that is sorted, but the 'index' "
            "tensor is not sorted: sort edge_index by destination nodes first")
    n = graph.num_dst
    counts = torch.bincount(dst, minlength=n)
    k = int(counts.max()) if counts.numel() and dst.numel() else 0
    if max_num_elements is not None:
        k = int(max_num_elements)
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(dst.numel(), device=x.device) - start[dst]
    keep = pos < k
    out = x.new_zeros((n, k) + tuple(x.shape[1:]))
    out[dst[keep], pos[keep]] = x[ei[0][keep]]
    return out


class LSTMAggregation(Aggregation):
    """PyG's LSTM aggregation: an LSTM (batch_first) over each destination's rows in edge
    order (edges sorted by destination, zero-padded), its last output; parameters `lstm.*`."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lstm = torch.nn.LSTM(in_channels, out_channels, batch_first=True, **kwargs)

    def reset_parameters(self) -> None:
        self.lstm.reset_parameters()

    def over(self, graph, x):
        return self.lstm(dense_rows(graph, x, name=type(self).__name__))[0][:, -1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


class MLPAggregation(Aggregation):
    """PyG's MLP aggregation: each destination's first max_num_elements rows (edges sorted
    by destination, zero-padded) flattened into an MLP. The MLP is PyG's plain form:
    Linear layers `mlp.lins.i` with ReLU between (num_layers=1: PyG's state dict loads)."""

    def __init__(self, in_channels: int, out_channels: int, max_num_elements: int,
                 num_layers: int = 1, hidden_channels: int | None = None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.max_num_elements = max_num_elements
        width = [in_channels * max_num_elements]
        width += [hidden_channels or out_channels] * (num_layers - 1) + [out_channels]
        self.mlp = torch.nn.Module()
        self.mlp.lins = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(width[:-1], width[1:]))

    def reset_parameters(self) -> None:
        for lin in self.mlp.lins:
            lin.reset_parameters()

    def over(self, graph, x):
        h = dense_rows(graph, x, self.max_num_elements, type(self).__name__)
        h = h.reshape(h.size(0), -1)
        for i, lin in enumerate(self.mlp.lins):
            h = lin(h) if i == 0 else lin(h.relu())
        return h

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"max_num_elements={self.max_num_elements})")


# ---- several aggregations combined ------------------------------------------------------------

class _DictLinear(torch.nn.Module):
    """PyG's HeteroDictLinear's parameters (`lins.<key>.*`): one Linear per key."""

    def __init__(self, channels: dict, out_channels: int):
        super().__init__()
        self.lins = torch.nn.ModuleDict({k: torch.nn.Linear(c, out_channels)
                                         for k, c in channels.items()})

    def reset_parameters(self) -> None:
        for lin in self.lins.values():
            lin.reset_parameters()


_DENSE_MODES = ("sum", "mean", "max", "min", "logsumexp", "std", "var")


class MultiAggregation(Aggregation):
    """PyG's MultiAggregation: several aggregations combined by `mode`: "cat" (default),
    "proj" (Linear `lin` over their concatenation), "attn" (per-aggregation Linear
    `lin_heads.lins.<i>` then MultiheadAttention `multihead_attn`, mean over them) or a
    dense reduction (sum, mean, max, min, logsumexp, std, var) across them."""

    def __init__(self, aggrs, aggrs_kwargs=None, mode: str = "cat", mode_kwargs=None):
        super().__init__()
        if not isinstance(aggrs, (list, tuple)) or not aggrs:
            raise LayerArgumentError(f"MultiAggregation: 'aggrs' should be a non-empty list "
                                     f"or tuple (got {aggrs!r})")
        if aggrs_kwargs is None:
            aggrs_kwargs = [{}] * len(aggrs)
        elif len(aggrs_kwargs) != len(aggrs):
            raise LayerArgumentError("MultiAggregation: 'aggrs_kwargs' with invalid length "
                                     f"(got {len(aggrs_kwargs)}, expected {len(aggrs)})")
        self.aggrs = torch.nn.ModuleList(resolve(a, **kw) for a, kw in
                                         zip(aggrs, aggrs_kwargs))
        self.mode = mode
        mode_kwargs = copy.copy(mode_kwargs) or {}
        self.in_channels = mode_kwargs.pop("in_channels", None)
        self.out_channels = mode_kwargs.pop("out_channels", None)
        if mode in ("proj", "attn"):
            self._projections(mode, mode_kwargs)
        elif mode != "cat" and mode not in _DENSE_MODES:
            raise LayerArgumentError(f"MultiAggregation: combine mode {mode!r} is not "
                                     "supported")

    def _projections(self, mode: str, mode_kwargs: dict) -> None:
        if len(self.aggrs) == 1:
            raise LayerArgumentError("Multiple aggregations are required for 'proj' or "
                                     "'attn' combine mode.")
        if self.in_channels is None or self.out_channels is None:
            raise LayerArgumentError(f"Combine mode '{mode}' must have `in_channels` and "
                                     "`out_channels` specified.")
        if isinstance(self.in_channels, int):
            self.in_channels = [self.in_channels] * len(self.aggrs)
        if mode == "proj":
            self.lin = torch.nn.Linear(sum(self.in_channels), self.out_channels,
                                       **mode_kwargs)
        else:
            channels = {str(k): v for k, v in enumerate(self.in_channels)}
            self.lin_heads = _DictLinear(channels, self.out_channels)
            heads = mode_kwargs.pop("num_heads", 1)
            self.multihead_attn = torch.nn.MultiheadAttention(self.out_channels, heads,
                                                              **mode_kwargs)

    def reset_parameters(self) -> None:
        for aggr in self.aggrs:
            aggr.reset_parameters()
        if self.mode == "proj":
            self.lin.reset_parameters()
        if self.mode == "attn":
            self.lin_heads.reset_parameters()
            self.multihead_attn._reset_parameters()

    def get_out_channels(self, in_channels: int) -> int:
        if self.out_channels is not None:
            return self.out_channels
        return in_channels * len(self.aggrs) if self.mode == "cat" else in_channels

    def over(self, graph, x):
        return self.combine([over(aggr, graph, x) for aggr in self.aggrs])

    def combine(self, outs: list) -> torch.Tensor:
        if len(outs) == 1:
            return outs[0]
        if self.mode == "cat":
            return torch.cat(outs, dim=-1)
        if self.mode == "proj":
            return self.lin(torch.cat(outs, dim=-1))
        if self.mode == "attn":
            xs = [self.lin_heads.lins[str(i)](o) for i, o in enumerate(outs)]
            x = torch.stack(xs, dim=0)
            return self.multihead_attn(x, x, x)[0].mean(dim=0)
        out = getattr(torch, self.mode)(torch.stack(outs, dim=0), dim=0)
        return out if isinstance(out, torch.Tensor) else out[0]

    def __repr__(self) -> str:
        inner = ",\n".join(f"  {a}" for a in self.aggrs) + ",\n"
        return f"{type(self).__name__}([\n{inner}], mode={self.mode})"


def over(aggr, graph: Graph, x) -> torch.Tensor:
    """aggr over the relation: a tg.nn.aggr module's own route, or another library's
    aggregation module (a torch_geometric Aggregation) called as PyG calls it, on the
    gathered source rows in torch: aggr(x_j, index, dim_size=..., dim=0)."""
    if isinstance(aggr, Aggregation):
        return aggr.over(graph, x)
    ei = edge_index_like(graph, x)
    return aggr(x[ei[0]], ei[1], dim_size=graph.num_dst, dim=0)


def _is_pyg_aggregation(module) -> bool:
    # matched by name, so torch_geometric (optional) is never imported here
    return isinstance(module, torch.nn.Module) and any(
        c.__name__ == "Aggregation" and c.__module__.startswith("torch_geometric.")
        for c in type(module).__mro__)


BY_NAME = {"sum": SumAggregation, "add": SumAggregation, "mean": MeanAggregation,
           "max": MaxAggregation, "min": MinAggregation, "mul": MulAggregation,
           "var": VarAggregation, "std": StdAggregation, "softmax": SoftmaxAggregation,
           "powermean": PowerMeanAggregation, "lstm": LSTMAggregation,
           "mlp": MLPAggregation}


def resolve(aggr, **kwargs) -> Aggregation:
    """An Aggregation from a name (PyG's: "sum"/"add", "mean", "max", "min", "mul", "var",
    "std", "softmax", "powermean", "lstm", "mlp"), a list of them (MultiAggregation), an
    Aggregation module (returned as it is), or a torch_geometric Aggregation module (also
    as it is: over() runs it in torch on the gathered rows)."""
    if isinstance(aggr, Aggregation):
        return aggr
    if _is_pyg_aggregation(aggr) and not kwargs:
        return aggr       # kept as it is (its state dict names too); run by over()
    if isinstance(aggr, (list, tuple)):
        return MultiAggregation(list(aggr), **kwargs)
    if isinstance(aggr, str):
        key = aggr.lower().replace("_", "")
        key = key[:-len("aggregation")] if key.endswith("aggregation") else key
        if key in BY_NAME:
            return BY_NAME[key](**kwargs)
    raise LayerArgumentError(f"aggr is {aggr!r}, expected one of {tuple(BY_NAME)}, a list "
                             "of them or a tg.nn.aggr.Aggregation module")


# the parameter-free aggregations fused_names names, one instance each (stateless)
_PLAIN = {n: BY_NAME[n]() for n in ("sum", "mean", "max", "min", "mul", "var", "std")}


def fused_names(aggr: Aggregation):
    """The aggregation as a string of parameter-free reducer names joined by "|" (one
    opaque op inside torch.compile), or None where it holds more than that."""
    parts = [aggr]
    if isinstance(aggr, MultiAggregation) and aggr.mode == "cat":
        parts = list(aggr.aggrs)
    names = []
    for a in parts:
        if type(a) in (SumAggregation, MeanAggregation, MaxAggregation, MinAggregation,
                       MulAggregation):
            names.append(a.name)
        elif type(a) in (VarAggregation, StdAggregation):
            semi = a.semi_grad if isinstance(a, VarAggregation) else a.var_aggr.semi_grad
            if semi:
                return None
            names.append("var" if isinstance(a, VarAggregation) else "std")
        else:
            return None
    return "|".join(names)


def over_names(names: str, graph: Graph, x) -> torch.Tensor:
    """fused_names' aggregation run over the relation."""
    outs = [_PLAIN[n].over(graph, x) for n in names.split("|")]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


__all__ = ["Aggregation", "SumAggregation", "MeanAggregation", "MaxAggregation",
           "MinAggregation", "MulAggregation", "VarAggregation", "StdAggregation",
           "SoftmaxAggregation", "PowerMeanAggregation", "MultiAggregation",
           "LSTMAggregation", "MLPAggregation", "resolve"]
