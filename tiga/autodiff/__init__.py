"""autodiff: reverse mode over GraphPrograms (explicit VJP rule per primitive)."""
from . import rules  # noqa: F401  (registers every VJP rule)
from .registry import NONDIFF, vjp_rules  # noqa: F401
from .vjp import vjp_program  # noqa: F401
