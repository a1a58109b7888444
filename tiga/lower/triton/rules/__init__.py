"""lower/triton: codegen rules per primitive family, registered in lowering_rules['triton']."""
from . import elementwise, linalg, reductions, shape  # noqa: F401
