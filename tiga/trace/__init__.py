"""trace: Python functions to GraphPrograms (tracer, pytrees, staging, control, messages)."""
from . import array_ops  # noqa: F401  (gives tracers their operators)
