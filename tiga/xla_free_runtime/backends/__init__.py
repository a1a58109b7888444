"""runtime/backends: the backend table: one object per target, chosen by a Kernel op's target.

A backend is an object with
    target                                  its name ("cpu-llvm"), the Kernel ops it runs
    render(kernel_op, call, symbol)         -> abi.KernelSource (text and signature)
    compile(key, render)                    -> Executable, through the one artifact cache
    launch(exe, launch_op, args, stream)    runs `exe` for `launch_op` on the bound `args`
and is registered with `register(backend)`, which adds or replaces the entry for its target
in `BACKENDS` (the runtime package registers the built-in ones, cpu-llvm and triton, on
import). Compiled kernels are launched by `launch(exe, op, args)` below, which looks the
backend up by `op.target` at each launch: so a backend registered in place of another (a
recording wrapper in the tests) sees those launches, Triton's fixed kernels (attention,
kNN selection, tile matmul: backends/triton/compile.launch_fixed) included.

`op` is the Kernel op the kernel was rendered from (a `gf_kernel.launch`, whose `name` the
call's Task module prints), or a `FixedKernel` for the kernels no propagate lowers to (cell
directories, page gathers, Triton's attention, kNN and tile matmul kernels), which a
cpu-llvm call's Task module lists by name on the task that runs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...core.errors import UnsupportedError

BACKENDS: dict = {}     # target -> backend (a registry: written by register only)


class KernelArgs(NamedTuple):
    """A launch's bound operands: on the host, the kernel's argument vector and how its rows
    are split over the pool (`chunks` None: one call over `rows`; `jobs`: independent calls
    (lo, hi, argv): partial sums, attention heads, run on the pool as they are); on triton,
    `jobs` are the kernel launches (function, grid, argv, meta), queued in order."""

    argv: object = None
    chunks: object = None
    threads: int = 1
    rows: tuple = (0, 0)
    jobs: object = None


@dataclass(frozen=True)
class FixedKernel:
    """A kernel no propagate lowers to (a cell directory build, a page gather), named by what
    it computes and the parameters its code depends on."""

    name: str
    target: str = "cpu-llvm"


@dataclass(frozen=True)
class Fallback:
    """The reference interpreter runs this propagate; `reason` is what explain() says."""

    reason: str


@dataclass(frozen=True)
class Unbound(Fallback):
    """A planner's answer when the call's bound Task module holds no Kernel op for the walk
    it binds (a program its stages do not walk): the reference interpreter runs it, since
    nothing in the runtime lowers."""


def unbound(walk: str) -> Unbound:
    return Unbound(f"the call's Task module holds no Kernel op for this propagate's {walk} "
                   "walk (the IR stages did not lower the program with it)")


def register(backend) -> object:
    """Add `backend` to the table (replacing the entry for its target); returns it."""
    missing = [a for a in ("target", "render", "compile", "launch") if not hasattr(backend, a)]
    if missing:
        raise UnsupportedError(f"register: a backend needs {', '.join(missing)} "
                               f"(found a {type(backend).__name__})",
                               hint="a backend has target, render, compile and launch")
    BACKENDS[backend.target] = backend
    return backend


def backend_for(target: str):
    """The backend registered for `target`, or UnsupportedError naming the targets there are."""
    found = BACKENDS.get(target)
    if found is None:
        raise UnsupportedError(f"no backend is registered for target {target!r}",
                               hint=f"registered: {', '.join(sorted(BACKENDS)) or 'none'}")
    return found


def launch(exe, op, args: KernelArgs, stream=None):
    """Run `exe` (compiled from `op`) on `args` through the backend of `op.target`."""
    return BACKENDS[op.target].launch(exe, op, args, stream)


__all__ = ["BACKENDS", "KernelArgs", "FixedKernel", "Fallback", "Unbound", "unbound", "register",
           "backend_for", "launch"]
