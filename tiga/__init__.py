"""Tiga: a just-in-time compiler for graph message passing. This module only re-exports."""
from __future__ import annotations

__version__ = "0.1.0"

from . import autodiff as _autodiff  # noqa: F401  (registers VJP rules)
from . import core as _core  # noqa: F401  (registers primitives)
from . import distributed, nn
from ._transforms import custom_jvp, custom_vjp, hessian, jacfwd, jacrev, jvp, linearize, vmap
from .api import grad, jit, value_and_grad, vjp
from .autodiff.fixed_point import fixed_point
from .core.check import check_program
from .core.config import ConfigError, config
from .core.dtypes import bfloat16, bool_, float16, float32, float64, int32, int64
from .core.errors import (
    CompilationError,
    DistributedError,
    DTypeError,
    FieldError,
    GraphValidationError,
    LayerArgumentError,
    ProgramError,
    RequiresGradError,
    ShapeError,
    StorageError,
    TigaError,
    TraceError,
    UnsupportedError,
)
from .core.eval import eval_program
from .core.graph import Graph
from .core.pprint import pp_program
from .core.program import ClosedProgram, GraphProgram
from .core.reducers import Reducer, argmax, argmin, max, mean, min, online_softmax, prod, sum
from .core.types import GraphType, TensorType
from .trace import math
from .trace.cond import cond, switch
from .trace.control import checkpoint, fori_loop, repeat, scan, while_loop
from .trace.message_passing import MessagePassing, edge_map, propagate
from .trace.staging import make_program
from .trace.unroll import TraceWarning
from .xla_free_runtime.backends.cpu import generated as _generated  # noqa: F401  (radius/knn route)
from .xla_free_runtime.caches.artifacts import CacheTrustWarning
from .xla_free_runtime.memory import budgets as memory
from .xla_free_runtime.memory.scope import scope
from .xla_free_runtime.memory.tensor import Tensor, asarray, from_dlpack, load, save
from .xla_free_runtime.paging import run as _paging  # noqa: F401  (registers the paged route)
from .xla_free_runtime.reports.explain import Explanation
from .xla_free_runtime.reports.runs import Profile, RunReport, profile
from .xla_free_runtime.store import stores as store

__all__ = [
    "__version__", "grad", "jit", "value_and_grad", "vjp", "check_program", "config",
    "bfloat16", "bool_", "float16", "float32", "float64", "int32", "int64",
    "CompilationError", "DistributedError", "DTypeError", "FieldError", "GraphValidationError",
    "ProgramError", "ShapeError", "StorageError", "TigaError", "TraceError", "UnsupportedError",
    "ConfigError", "CacheTrustWarning", "TraceWarning", "LayerArgumentError", "RequiresGradError",
    "eval_program", "Graph", "pp_program", "ClosedProgram", "GraphProgram", "Reducer", "max",
    "mean", "min", "online_softmax", "prod", "sum", "GraphType", "TensorType", "math", "repeat",
    "while_loop", "MessagePassing", "propagate", "make_program", "Explanation", "Tensor",
    "asarray", "from_dlpack", "nn", "distributed", "argmin", "argmax", "edge_map", "profile",
    "Profile", "RunReport", "scope", "memory", "store", "load", "save",
    "jvp", "linearize", "jacfwd", "jacrev", "hessian", "vmap", "custom_vjp", "custom_jvp",
    "scan", "fori_loop", "cond", "switch", "checkpoint", "fixed_point",
]

# the transformations live in a private module: to help(), tracebacks and the reference
# they are tg.jvp, tg.vmap, ... (tiga.jvp resolves, so pickling by name still works)
for _f in (hessian, jacfwd, jacrev, jvp, linearize, vmap):
    _f.__module__ = __name__
del _f


def __dir__() -> list[str]:
    """dir(tiga): the public API (the subpackages stay importable, but are not listed)."""
    return sorted(__all__)
