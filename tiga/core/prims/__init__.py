"""core: primitive families; importing this package registers every primitive's rules."""
from . import control, custom, elementwise, generated, graph, linalg, reductions, shape  # noqa: F401
