"""benchmarks.workloads: the registry. One module per workload family; each defines
`WORKLOADS`, a list of `Workload`. A new module dropped in this folder is found by `registry()`
(so a later workload, e.g. feature-space kNN or paging, is one file; see README in RESULTS.md).

Protocol, all run inside the worker process:
- `setup(size)` builds the inputs (deterministic, seeded) as a dict;
- `expected(data, i)` gives the float64 oracle outputs of call number i (calls alternate
  inputs in dynamic workloads, so i matters there), computed independently of every peer;
- each `Peer.factory(data, threads)` returns `fn(i)` running call i, or None when the peer has
  no such path (reported "n/a"). Imports of the peer's library happen inside the factory.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Peer:
    factory: Callable
    requires: tuple = ()          # modules that must be importable (checked before spawning)
    max_size: int | None = None   # larger sizes are "n/a" (e.g. O(N^2) memory)
    tiga: bool = False            # the implementation under test (duplicated by --compare)
    note: str = ""                # how it is configured, for the report


@dataclass(frozen=True)
class Workload:
    name: str                     # "<family>.<mode>", e.g. "stored_csr.fwd"
    title: str
    description: str              # markdown, shown above the workload's table
    sizes: tuple
    setup: Callable
    expected: Callable
    peers: dict
    size_label: str = "N"
    dtype: str = "float32"        # the inputs' precision: picks the oracle tolerance
    quick_sizes: tuple = ()       # default: the smallest size
    tol_scale: float = 1.0        # multiplies measure.DEFAULT_TOL (sums of many terms)
    runner: Callable | None = None  # a worker of its own (first-call latency)
    extra: dict = field(default_factory=dict)

    def quick(self) -> tuple:
        return self.quick_sizes or (min(self.sizes),)


def _modules() -> list:
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name for m in pkgutil.iter_modules([here]) if not m.name.startswith("_"))


def registry() -> dict:
    """name -> Workload over every workload module (in module, then declaration order)."""
    out = {}
    for mod in _modules():
        for wl in importlib.import_module(f"{__name__}.{mod}").WORKLOADS:
            out[wl.name] = wl
    return out


def installed(peer: Peer) -> str | None:
    """None when every module the peer needs can be found, else the missing one's name."""
    for mod in peer.requires:
        try:
            if importlib.util.find_spec(mod) is None:
                return mod
        except (ImportError, ValueError):
            return mod
    return None
