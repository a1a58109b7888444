"""testing: oracles for checking a compiled route against the reference interpreter, and a
recording backend that sees every kernel launch (with the kernel names printed IR holds)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable

from .api import grad
from .core.eval import eval_program
from .lower.ir.kernel import LaunchOp
from .lower.ir.task import TaskLaunchOp, parse_task
from .trace.staging import make_program
from .xla_free_runtime.backends import BACKENDS, register


def reference_grad(fn: Callable, argnums=0) -> Callable:
    """`tg.grad(fn, argnums)` with its whole program (forward and VJP) run by the numpy
    reference interpreter. A `reference()` call inside `tg.grad` is not an oracle by itself:
    it is inlined into the traced program, which then runs on the compiled route."""
    def run(*args):
        outs = eval_program(make_program(grad(fn, argnums=argnums))(*args), *args)
        return outs[0] if isinstance(argnums, int) else tuple(outs)
    return run



class RecordingBackend:
    """A backend that records each launch op and delegates everything to `inner`."""

    def __init__(self, inner):
        self.inner = inner
        self.target = inner.target
        self.launched: list = []

    def render(self, *args, **kwargs):
        return self.inner.render(*args, **kwargs)

    def compile(self, *args, **kwargs):
        return self.inner.compile(*args, **kwargs)

    def launch(self, exe, op, args, stream=None):
        self.launched.append(op)
        return self.inner.launch(exe, op, args, stream)

    def __getattr__(self, name):     # (plan, artifact, page_plan: the inner backend's)
        return getattr(self.inner, name)

    def names(self) -> set:
        """The names of the Kernel ops launched so far."""
        return {getattr(op, "kernel", op).name for op in self.launched}


@contextlib.contextmanager
def recording(target: str = "cpu-llvm"):
    """Register a RecordingBackend in place of `target`'s backend for the block."""
    inner = BACKENDS[target]
    rec = register(RecordingBackend(inner))
    try:
        yield rec
    finally:
        register(inner)


def printed_kernels(text: str) -> set:
    """Names of the kernels printed Task IR holds (several modules: each parsed alone)."""
    found: set = set()
    starts = [i for i, line in enumerate(text.splitlines()) if line.startswith("module @")]
    lines = text.splitlines()
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        _collect(parse_task("\n".join(lines[a:b]) + "\n").body, found)
    return found


def _collect(region, found: set) -> None:
    for op in region.ops:
        if isinstance(op, LaunchOp):
            found.add(op.name)
        if isinstance(op, TaskLaunchOp):
            found.update(op.kernels)
        for r in getattr(op, "regions", ()) or ():
            if hasattr(r, "ops"):
                _collect(r, found)


