"""tg.nn: capture torch.nn modules as traceable edge/update functions.

Torch-free on import: `trace` reaches the torch bridge (the only layer that imports torch)
when it is called, so `import tiga` keeps working without torch.
"""
from __future__ import annotations

from .core.errors import UnsupportedError


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
        raise UnsupportedError(f"tg.nn.trace needs PyTorch ({exc})",
                               hint="pip install torch==2.13.0, or write the edge function "
                                    "with tg.math") from exc
    return trace_module(module)


__all__ = ["trace"]
