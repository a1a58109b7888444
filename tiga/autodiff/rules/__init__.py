"""autodiff: VJP rules, one module per primitive family; importing registers them."""
from . import control, elementwise, graph, linalg, reductions, shape  # noqa: F401
