"""autodiff: batching rules, one module per primitive family; importing registers them."""
from . import array, control, graph  # noqa: F401
