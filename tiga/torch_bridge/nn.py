"""torch_bridge: tg.nn.trace, a torch.nn module evaluated with tg.math on traced rows.

The module is not replaced or copied: each call reads its live Parameters, which the tracer
captures through the bridge's resolver (so their gradients flow back through
torch.autograd). A layer is a small function of (row, module); the table below is the whole
capture contract, and anything outside it raises tg.UnsupportedError naming the module.
A subclass of a supported module is captured as its base class when it keeps the base's
forward (an overridden forward could compute anything). PyG's `torch_geometric.nn.Linear`
is captured like `nn.Linear` (recognised by name: torch_geometric is never imported). An
attribute that cannot be read (or is a lazy, uninitialized weight) is named in the error.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from ..core.errors import ShapeError, UnsupportedError
from ..trace import math as m

SUPPORTED = ("Sequential", "Linear", "ReLU", "LeakyReLU", "ELU", "Softplus", "GELU", "SiLU",
             "Tanh", "Sigmoid", "Identity", "Dropout (eval mode)", "LayerNorm",
             "torch_geometric.nn.Linear", "and subclasses of these that keep their forward")
_HINT = f"supported modules: {', '.join(SUPPORTED)}"


def _read(layer, path: str, attr: str):
    """layer.<attr>, or an UnsupportedError naming the module and the attribute."""
    try:
        return getattr(layer, attr)
    except Exception as exc:  # a property may raise anything; report it, do not guess
        raise UnsupportedError(
            f"tg.nn.trace: module {path} ({type(layer).__name__}): cannot read attribute "
            f"{attr!r} ({type(exc).__name__}: {exc})", hint=_HINT) from exc


def _is_pyg_linear(cls) -> bool:
    # matched by name, so torch_geometric (optional) is never imported here
    return cls.__name__ == "Linear" and cls.__module__.startswith("torch_geometric.")


def _linear_parts(layer, path: str) -> tuple:
    """(weight (out, in), bias or None, in, out) of a torch or PyG Linear, checked."""
    pyg = any(_is_pyg_linear(c) for c in type(layer).__mro__)
    weight = _read(layer, path, "weight")
    if isinstance(weight, UninitializedParameter):
        raise UnsupportedError(
            f"tg.nn.trace: module {path} ({type(layer).__name__}): attribute 'weight' is "
            "uninitialized (a lazy Linear with in_channels=-1)",
            hint="run one forward pass through the module, or construct it with an explicit "
                 "in_channels, before tracing it")
    bias = _read(layer, path, "bias")
    n_in = _read(layer, path, "in_channels" if pyg else "in_features")
    n_out = _read(layer, path, "out_channels" if pyg else "out_features")
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (n_out, n_in):
        found = (tuple(weight.shape) if isinstance(weight, torch.Tensor) else
            type(weight).__name__)
        raise UnsupportedError(
            f"tg.nn.trace: module {path} ({type(layer).__name__}): attribute 'weight' is "
            f"{found}, expected a tensor of shape ({n_out}, {n_in})", hint=_HINT)
    if bias is not None and (not isinstance(bias, torch.Tensor)
                             or tuple(bias.shape) != (n_out,)):
        raise UnsupportedError(
            f"tg.nn.trace: module {path} ({type(layer).__name__}): attribute 'bias' is "
            f"{getattr(bias, 'shape', type(bias).__name__)}, expected None or shape "
            f"({n_out},)", hint=_HINT)
    return weight, bias, n_in, n_out


def _linear(x, layer, path: str):
    # Compiled per-edge loops run fastest with the longer axis of W innermost (contiguous,
    # vectorised), in the product and in its gradient's outer product: a narrow output
    # (out < in) contracts x with the rows of W as stored (out, in); otherwise x @ W^T. The
    # transpose is traced (not taken by torch), so the captured value is the Parameter
    # itself (a cached call re-reads it) and the rewrites move the transpose out of the
    # edge loop (once per call).
    weight, bias, n_in, n_out = _linear_parts(layer, path)
    if n_out < n_in:
        nd = m._typeof(x).ndim
        y = m.dot_general(x, weight, (((nd - 1,), (1,)), ((), ())))
    else:
        y = m.matmul(x, m.transpose(weight))
    return y if bias is None else m.add(y, bias)


def _relu(x):
    # a scalar 0 stays a literal of the edge function (zeros_like would become a captured
    # array operand, whose unused cotangent the VJP would then fold over every edge)
    return m.where(m.greater(x, 0.0), x, 0.0)


def _dropout(x, layer, path: str):
    p, training = _read(layer, path, "p"), _read(layer, path, "training")
    if training and p > 0:
        raise UnsupportedError(f"{type(layer).__name__} in training mode (p={p}) "
                               "inside a traced module",
                               hint="call module.eval() before tracing, or set p=0")
    return x


def _layer_norm(x, layer, path: str):
    shape = _read(layer, path, "normalized_shape")
    weight, bias = _read(layer, path, "weight"), _read(layer, path, "bias")
    axes = tuple(range(-len(shape), 0))
    mu = m.mean(x, axis=axes, keepdims=True)
    centred = m.subtract(x, mu)
    var = m.mean(m.multiply(centred, centred), axis=axes, keepdims=True)
    y = m.multiply(centred, m.rsqrt(m.add(var, _read(layer, path, "eps"))))
    if weight is not None:
        y = m.multiply(y, weight)
    if bias is not None:
        y = m.add(y, bias)
    return y


def _hyper(fn, *attrs):
    """A capture of fn(x, *hyperparameters read from the layer by name)."""
    return lambda x, layer, path: fn(x, *(_read(layer, path, a) for a in attrs))


# base class -> capture(x, layer, path); subclasses resolve through their MRO
LAYERS = {
    nn.Linear: _linear,
    nn.ReLU: lambda x, layer, path: _relu(x),
    nn.LeakyReLU: _hyper(m.leaky_relu, "negative_slope"),
    nn.ELU: _hyper(m.elu, "alpha"),
    nn.Softplus: _hyper(m.softplus, "beta", "threshold"),
    nn.GELU: _hyper(m.gelu, "approximate"),
    nn.SiLU: lambda x, layer, path: m.silu(x),
    nn.Tanh: lambda x, layer, path: m.tanh(x),
    nn.Sigmoid: lambda x, layer, path: m.sigmoid(x),
    nn.Identity: lambda x, layer, path: x,
    nn.Dropout: _dropout,
    nn.LayerNorm: _layer_norm,
}


def _base(cls):
    """The supported class `cls` is or derives from (nn.Sequential included), or None."""
    for c in cls.__mro__:
        if c in LAYERS or c is nn.Sequential or _is_pyg_linear(c):
            return c
    return None


def _capture(module, path: str):
    base = _base(type(module))
    if base is None:
        raise UnsupportedError(
            f"tg.nn.trace: module {path} is a {type(module).__name__}, which cannot be "
            "captured", hint=_HINT)
    if type(module).forward is not base.forward:
        # the table reproduces the base class's forward; a new forward could compute anything
        raise UnsupportedError(
            f"tg.nn.trace: module {path} is a {type(module).__name__}, a subclass of "
            f"{base.__name__} that overrides forward, which cannot be captured",
            hint=f"keep {base.__name__}.forward, or compose supported modules in a "
                 "Sequential")
    return base


def _flatten(module, path: str) -> list:
    """[(path, layer, capture)] of the leaves, in call order; rejects unsupported modules."""
    base = _capture(module, path)
    if base is nn.Sequential:
        out = []
        for name, child in module.named_children():
            out += _flatten(child, f"{path}.{name}")
        return out
    if base in LAYERS:
        return [(path, module, LAYERS[base])]
    _linear_parts(module, path)   # a PyG Linear: fail now if it is lazy and uninitialized
    return [(path, module, _linear)]


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
            for _, layer, _ in self.layers)

    def __call__(self, *inputs):
        if not inputs:
            raise ShapeError("tg.nn.trace: the module needs at least one input")
        x = inputs[0] if len(inputs) == 1 else m.concatenate(list(inputs), axis=-1)
        width = m._typeof(x).shape[-1] if m._typeof(x).ndim else None
        if self.in_features is not None and width != self.in_features:
            raise ShapeError(f"tg.nn.trace: inputs concatenate to {width} features, but "
                             f"{self.layers[0][0]} expects {self.in_features}")
        for path, layer, capture in self.layers:
            try:
                x = capture(x, layer, path)
            except ShapeError as exc:
                raise ShapeError(
                    f"tg.nn.trace: {path} ({type(layer).__name__}): {exc}") from exc
        return x

    def __repr__(self) -> str:
        return f"tg.nn.trace({self.module!r})"


def _first_width(layers):
    for path, layer, capture in layers:
        if capture is _linear:
            return _linear_parts(layer, path)[2]
        if isinstance(layer, nn.LayerNorm):
            return layer.normalized_shape[-1] if len(layer.normalized_shape) == 1 else None
    return None


def trace_module(module) -> TracedModule:
    if not isinstance(module, nn.Module):
        raise UnsupportedError(f"tg.nn.trace: expected a torch.nn.Module, found "
                               f"{type(module).__name__}",
                               hint=_HINT)
    return TracedModule(module)


__all__ = ["trace_module", "TracedModule", "SUPPORTED"]
