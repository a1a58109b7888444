"""lower/llvm: codegen rules per primitive family, registered in lowering_rules['cpu-llvm']."""
from . import elementwise, linalg, reductions, shape  # noqa: F401
