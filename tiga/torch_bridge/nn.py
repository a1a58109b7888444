"""torch_bridge: tg.nn.trace, a torch.nn module evaluated with tg.math on traced rows.

The module is not replaced or copied: each call reads its live Parameters, which the tracer
captures through the bridge's resolver (so their gradients flow back through
torch.autograd). A layer is a small function of (row, module); the table below is the whole
capture contract, and anything outside it raises tg.UnsupportedError naming the module.
"""
from __future__ import annotations

from torch import nn

from ..core.errors import ShapeError, UnsupportedError
from ..trace import math as m

SUPPORTED = ("Sequential", "Linear", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Identity",
             "Dropout (eval mode)", "LayerNorm")


def _linear(x, layer: nn.Linear):
    # Compiled per-edge loops run fastest with the longer axis of W innermost (contiguous,
    # vectorised), in the product and in its gradient's outer product: a narrow output
    # (out < in) contracts x with the rows of W as stored (out, in); otherwise x @ W^T. The
    # transpose is traced (not taken by torch), so the captured value is the Parameter
    # itself (a cached call re-reads it) and the rewrites move the transpose out of the
    # edge loop (once per call).
    if layer.out_features < layer.in_features:
        nd = m._typeof(x).ndim
        y = m.dot_general(x, layer.weight, (((nd - 1,), (1,)), ((), ())))
    else:
        y = m.matmul(x, m.transpose(layer.weight))
    return y if layer.bias is None else m.add(y, layer.bias)


def _relu(x):
    # a scalar 0 stays a literal of the edge function (zeros_like would become a captured
    # array operand, whose unused cotangent the VJP would then fold over every edge)
    return m.where(m.greater(x, 0.0), x, 0.0)


def _gelu(x, layer: nn.GELU):
    return m.gelu(x, approximate=layer.approximate)


def _dropout(x, layer: nn.Dropout):
    if layer.training and layer.p > 0:
        raise UnsupportedError(f"{type(layer).__name__} in training mode (p={layer.p}) "
                               "inside a traced module",
                               hint="call module.eval() before tracing, or set p=0")
    return x


def _layer_norm(x, layer: nn.LayerNorm):
    axes = tuple(range(-len(layer.normalized_shape), 0))
    mu = m.mean(x, axis=axes, keepdims=True)
    centred = m.subtract(x, mu)
    var = m.mean(m.multiply(centred, centred), axis=axes, keepdims=True)
    y = m.multiply(centred, m.rsqrt(m.add(var, layer.eps)))
    if layer.weight is not None:
        y = m.multiply(y, layer.weight)
    if layer.bias is not None:
        y = m.add(y, layer.bias)
    return y


LAYERS = {
    nn.Linear: _linear,
    nn.ReLU: lambda x, layer: _relu(x),
    nn.GELU: _gelu,
    nn.SiLU: lambda x, layer: m.silu(x),
    nn.Tanh: lambda x, layer: m.tanh(x),
    nn.Sigmoid: lambda x, layer: m.sigmoid(x),
    nn.Identity: lambda x, layer: x,
    nn.Dropout: _dropout,
    nn.LayerNorm: _layer_norm,
}


def _flatten(module, path: str) -> list:
    """[(path, layer)] of the leaves, in call order; rejects anything not in LAYERS."""
    if type(module) is nn.Sequential:
        out = []
        for name, child in module.named_children():
            out += _flatten(child, f"{path}.{name}")
        return out
    if type(module) not in LAYERS:
        raise UnsupportedError(
            f"tg.nn.trace: module {path} is a {type(module).__name__}, which cannot be "
            "captured", hint=f"supported modules: {', '.join(SUPPORTED)}")
    return [(path, module)]


class TracedModule:
    """`traced(*rows)`: the module on the concatenation of `rows` along the last axis."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.layers = _flatten(module, type(module).__name__)
        self.in_features = _first_width(self.layers)

    def parameters(self):
        return self.module.parameters()

    def __tiga_fingerprint__(self) -> tuple:
        """What a staged call depends on (the call cache's key): each layer's identity,
        mode and hyperparameters, and the identity, shape and dtype of its tensors. Values
        are not in it: parameters are program inputs, read on every call."""
        return tuple(
            (id(layer), layer.training, layer.extra_repr(),
             tuple((n, id(t), tuple(t.shape), t.dtype) for n, t in
                   list(layer.named_parameters(recurse=False))
                   + list(layer.named_buffers(recurse=False))))
            for _, layer in self.layers)

    def __call__(self, *inputs):
        if not inputs:
            raise ShapeError("tg.nn.trace: the module needs at least one input")
        x = inputs[0] if len(inputs) == 1 else m.concatenate(list(inputs), axis=-1)
        width = m._typeof(x).shape[-1] if m._typeof(x).ndim else None
        if self.in_features is not None and width != self.in_features:
            raise ShapeError(f"tg.nn.trace: inputs concatenate to {width} features, but "
                             f"{self.layers[0][0]} expects {self.in_features}")
        for path, layer in self.layers:
            try:
                x = LAYERS[type(layer)](x, layer)
            except ShapeError as exc:
                raise ShapeError(f"tg.nn.trace: {path} ({type(layer).__name__}): {exc}") \
                    from exc
        return x

    def __repr__(self) -> str:
        return f"tg.nn.trace({self.module!r})"


def _first_width(layers):
    for _, layer in layers:
        if isinstance(layer, nn.Linear):
            return layer.in_features
        if isinstance(layer, nn.LayerNorm):
            return layer.normalized_shape[-1] if len(layer.normalized_shape) == 1 else None
    return None


def trace_module(module) -> TracedModule:
    if not isinstance(module, nn.Module):
        raise UnsupportedError(f"tg.nn.trace: expected a torch.nn.Module, found "
                               f"{type(module).__name__}",
                               hint=f"supported modules: {', '.join(SUPPORTED)}")
    return TracedModule(module)


__all__ = ["trace_module", "TracedModule", "SUPPORTED"]
