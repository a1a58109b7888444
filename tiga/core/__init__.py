"""core: types, primitives and registries, programs, the reference interpreter, relations."""
from . import prims  # noqa: F401  (registers every primitive's rules)
