"""core: deterministic jaxpr-style printer for GraphPrograms.

The printer is defined in program.py, beside the classes it prints: GraphProgram's
structure key and str() are its output, and it tells the program classes apart.
"""
from .program import pp_program  # noqa: F401
