"""lower/ir: the four IR levels (Domain, Iter, Kernel, Task/Storage) with printer and parser.

Importing this package registers every level, so `parse_module` reads text of any level.
"""
from .base import (  # noqa: F401
    Module,
    Region,
    RelationOp,
    TensorOp,
    Value,
    program_from_module,
    program_from_region,
    walk_ops,
)
from .domain import ApplyOp, Computation, DomainModule, ReducerSpec  # noqa: F401
from .iter import IterModule, TraverseOp  # noqa: F401
from .kernel import KernelModule, LaunchOp, Schedule  # noqa: F401
from .task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp  # noqa: F401
from .text import parse_module, print_module  # noqa: F401

LEVELS = ("domain", "iter", "kernel", "task")
