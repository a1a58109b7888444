"""autodiff: reverse mode, forward mode and batching over GraphPrograms (a rule per primitive)."""
from . import batch_rules, custom, jvp_rules, rules  # noqa: F401  (registers every rule)
from .jvp import forward_pass, jvp_program  # noqa: F401  (registry: autodiff.jvp.jvp_rules)
from .registry import NONDIFF, vjp_rules  # noqa: F401
from .vjp import vjp_program  # noqa: F401
