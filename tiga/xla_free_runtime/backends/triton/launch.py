"""runtime: the triton / triton-interpreter routes of one `propagate`: plan, compile, launch.

`backend_plan` is the executor's planner: it reads the selected backend (lower/backends.py)
and returns the cpu-llvm plan, a `TritonPlan`, or a Fallback naming why the reference runs.
A TritonPlan renders the equation's Kernel op for target triton, handed down by the executor
(where none fits, the plan is an Unbound, a Fallback: this module never lowers, so the
schedule printed there is the one rendered) into a
Triton module artifact of the one artifact cache
(artifacts.py: keyed by the printed op, the backend, triton's version and Tiga's source hash;
stored on disk like every backend's artifacts) and imports it on first launch (compile.py;
with TRITON_INTERPRET=1 for the interpreter: Triton decides at decoration time), then launches
it on torch tensors: CPU tensors under the interpreter, CUDA tensors on the GPU.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np

from ....core.config import config
from ....core.errors import UnsupportedError
from ....core.graph_validate import input_device
from ....lower.abi import KernelSource, relation_descriptor
from ....lower.backends import BACKENDS, route_for_devices, selected_backend, targets_triton
from ....lower.triton import TritonUnsupported
from ...caches.equations import kept
from ...caches.relations import memo
from ...reports.runs import COUNTERS
from .. import Fallback, KernelArgs, Unbound, backend_for, launch, unbound
from ..relation_arrays import walk_arrays, walked_csr
from .attention import attention_plan
from .compile import (
    TritonModule,
    ensure_interpreter,
    launch_result,
    module_key,
    tensors,
)
from .generated import generated_walk

# (id(Kernel op), backend, relation walk, edge permutation) -> (weak op, TritonPlan): what
# a call's held op renders to, found again without printing the op
_PLANS: dict = {}


def call_devices(call) -> dict:
    """{label: device} of a message-passing call's relation, fields and keyword operands
    (read from DLPack / the relation's recorded device; nothing is copied)."""
    out = {"graph": str(getattr(call.graph, "device", "cpu") or "cpu")}
    for role, name, value in call.field_items():
        out[f"{role}.{name}"] = input_device(value)
    for key, value in call.param_items():
        out[key] = input_device(value)
    return out


def call_backend(call) -> str | None:
    """The backend a call runs on because of where its inputs live: None for host inputs,
    "triton" for CUDA inputs, else tg.UnsupportedError naming the field (no triton, no GPU,
    strict mode with a CPU backend selected) before any CUDA data is copied."""
    devices = call_devices(call)
    if all(d == "cpu" for d in devices.values()):
        return None
    name = config.backend
    return route_for_devices(devices, name, strict=config.strict,
                             gpu=BACKENDS["triton"].available())


def backend_plan(eqn, graph, *, compile: bool = True, held=None):
    """The plan of one propagate over a relation held in memory on the selected Triton
    backend (Triton.plan; `held`: the Kernel op handed down for it, rendered when it fits)."""
    name = selected_backend()
    ok, why = BACKENDS[name].available()
    if not ok:
        raise UnsupportedError(f"backend {name!r} is unavailable: {why}",
                               hint="unset TIGA_BACKEND / tg.config.backend (cpu-llvm), or "
                                    "install the gpu extra")
    if BACKENDS[name].interpreter:
        ensure_interpreter()
    if graph is None and compile:
        return Fallback("the relation is not known until the call")
    per_eqn = kept(eqn, "triton_routes")    # {(id(graph), backend): (weak graph, plan)}
    hit = per_eqn.get((id(graph), name))
    if hit is not None and hit[0]() is graph:
        return hit[1]
    found = attention_plan(eqn, graph, name)
    if found is None:
        try:
            found = TritonPlan.build(eqn, graph, name, held)
        except TritonUnsupported as exc:
            return Fallback(f"{name}: {exc}")
        if isinstance(found, Unbound):
            return found
    if getattr(graph, "kind", None) not in ("radius", "knn"):   # (planned from their state)
        if len(per_eqn) > 64:
            per_eqn.clear()
        per_eqn[(id(graph), name)] = (weakref.ref(graph), found)
    return found


def triton_walk(eqn, graph) -> tuple:
    """(the relation descriptor a Triton kernel of `eqn` walks over `graph`, whether it reads
    an edge permutation, the relation type its Kernel op is lowered for: a relation walked
    through its resolved CSR as a CSR, with the relation's index dtype, which the kernel is
    rendered per): what the call's binding lowers (binding.py) and TritonPlan renders."""
    walk = "src" if eqn.params["reduce_by"] == "src" else "dst"
    has_perm = walk == "dst" and getattr(graph, "edge_perm", None) is not None
    relation = relation_descriptor(graph, walk, target="triton")
    if relation[0] == "radius" and ("edge" in eqn.params["roles"] or
                                    eqn.params["reduce_by"] == "edge"):
        relation = ("csr",)    # edge ids in the reference's order: its CSR
    gtype = eqn.inputs[0].type
    if gtype.kind != "csr" and relation == ("csr",):   # walked through its resolved CSR
        gtype = replace(gtype, kind="csr", coord_dims=None)
    index = graph.index_dtype if graph is not None else gtype.index_dtype
    return relation, has_perm, replace(gtype, index_dtype=index)


def page_kernel_plan(backend: str, eqn, graph, held):
    """The TritonPlan of a paged run's page kernel over the page-local CSR `graph` (`held`:
    its Kernel op, handed down), or a Fallback naming why its pages run the reference
    interpreter."""
    try:
        return TritonPlan.build(eqn, graph, backend, held)
    except TritonUnsupported as exc:
        return Fallback(f"{backend}: {exc}")


@dataclass
class TritonPlan:
    """A rendered propagate kernel for one (equation structure, relation layout, backend)."""

    backend: str
    key: str                   # the artifact key of its module
    source: KernelSource
    schedule: object           # the Kernel IR Schedule it was rendered with
    artifact: TritonModule
    op: object = None          # the Kernel op it renders (launched through the table)

    @classmethod
    def build(cls, eqn, graph, backend: str, held=None):
        """The plan rendering `held` (the Kernel op handed down for the walk bound here),
        or an Unbound when it does not fit. Kept per held op (the call's walk holds it)."""
        relation, has_perm, bound = triton_walk(eqn, graph)
        if (held is None or held.schedule.target != "triton"
                or held.comp.relation.type.kind != bound.kind
                or held.comp.relation.type.index_dtype != bound.index_dtype):
            return unbound(f"triton {bound.kind}")
        key = (id(held), backend, relation, has_perm)
        warm = _PLANS.get(key)
        if warm is not None and warm[0]() is held:
            return warm[1]
        mkey = module_key(str(held), backend, (relation, has_perm))
        call = {"has_perm": has_perm, "relation": relation}
        artifact = backend_for("triton").compile(
            mkey, lambda symbol: backend_for("triton").render(held, call, symbol), backend)
        found = cls(backend, mkey, artifact.source, held.schedule, artifact, held)
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = (weakref.ref(held), found)
        return found

    # ---- compile -------------------------------------------------------------------------

    def kernel(self, part: str = ""):
        """The kernel function (`part` "part" / "comb": the split path's kernels)."""
        mod = self.artifact.module()
        symbol = self.source.signature.symbol
        return getattr(mod, f"{symbol}_{part}" if part else symbol)

    # ---- run -----------------------------------------------------------------------------

    def run(self, eqn, graph, values: list) -> list:
        buf = tensors()
        sig = self.source.signature
        device = "cpu" if BACKENDS[self.backend].interpreter else "cuda"
        walk = _torch_walk(graph, sig, device)
        rows = graph.num_src if sig.walk == "src" else graph.num_dst
        lead = {"dst": graph.num_dst, "src": graph.num_src, "edge": graph.num_edges,
                "all": graph.num_dst}[sig.reduce_by]
        args = [walk[s] for s in sig.slots if not s.startswith(("field:", "out:"))]
        args += [buf.from_array(x, sig.field_dtypes[i], device) for i, x in enumerate(values)]
        outs = [buf.zeros((lead,) + tuple(s), d, device)
                for s, d in zip(sig.out_shapes, sig.out_dtypes)]
        if rows > 0:
            grid = (-(-rows // sig.block_rows),)
            meta = dict(BLOCK_R=sig.block_rows, BLOCK_N=sig.block_neighbors,
                        num_warps=sig.num_warps, num_stages=sig.num_stages)
            launch(self.artifact, self.op,
                   KernelArgs(jobs=[(self.kernel(), grid, (*args, *outs, rows), meta)]))
            if sig.split_degree:
                self._run_split(graph, sig, device, walk["row_ptr"], args + outs)
        if sig.combine:   # reduce_by="all": per-row partial sums, added here
            outs = [o.sum(dim=0) for o in outs]
            if sig.combine == "mean":
                outs = [o / max(graph.num_edges, 1) for o in outs]
        return [launch_result(buf, o, d, device) for o, d in zip(outs, sig.out_dtypes)]

    def _run_split(self, graph, sig, device: str, row_ptr, args: list) -> None:
        """Rows above the split degree (the main kernel gave them no edges): per-chunk
        reducer states, then one merge per row in chunk order, on the same stream."""
        plan = _split_plan(graph, sig, device, row_ptr)
        if plan is None:
            return
        heavy, first, chunk_row, chunk_lo = plan
        COUNTERS["split_launches"] += 1
        buf = tensors()
        parts = [buf.zeros((chunk_row.shape[0], n), d, device) for n, d in sig.split_states]
        meta = dict(BLOCK_R=sig.block_rows, BLOCK_N=sig.block_neighbors,
                    num_warps=sig.num_warps, num_stages=sig.num_stages)
        n, m = chunk_row.shape[0], heavy.shape[0]
        launch(self.artifact, self.op, KernelArgs(jobs=[
            (self.kernel("part"), (-(-n // sig.block_rows),),
             (*args, *parts, chunk_row, chunk_lo, n), meta),
            (self.kernel("comb"), (-(-m // sig.block_rows),),
             (*args, *parts, heavy, first, m), meta)]))

    # ---- explain -------------------------------------------------------------------------

    def describe(self, ex, eqn, graph, where: str) -> None:
        p, sig = eqn.params, self.source.signature
        kind = (graph.kind if graph is not None and hasattr(graph, "kind") else
                eqn.inputs[0].type.kind)
        ex.routes.append((self.backend, f"{where}propagate[{p['reducer'].pp_param()}] by "
                          f"{p['reduce_by']}", "rendered as a fused Triton kernel"))
        walk = ("the transposed CSR (built once per relation and cached; no atomics)"
                if sig.walk == "src" else "their CSR edges")
        if sig.relation[0] == "radius":
            walk = (f"the {3 ** sig.relation[1]} neighbour cells of a cell directory "
                    "counting-sorted on the launch device, exact distance test per candidate")
        elif sig.relation[0] != "csr":
            walk = f"their {sig.relation[0]} edges computed from indices (no CSR)"
        elif kind == "knn" and sig.walk == "dst" and "edge_perm" not in sig.slots:
            how = ("through cell shells of a directory counting-sorted there"
                   if 1 <= int(getattr(graph, "coord_dims", 0) or 0) <= 3 else "by a full scan")
            walk = ("the k nearest sources a Triton kernel selected on the launch device "
                    f"{how} (nearest first, ties by index)")
        resolved = ("" if kind in ("csr", "knn") or sig.relation[0] != "csr" else
                    f" (the {kind} relation resolved to CSR)")
        ex.traversal.append(f"propagate[{p['reducer'].pp_param()}] over {kind} relation"
                            f"{resolved}, grouped by {p['reduce_by']}: one Triton program per "
                            f"{sig.block_rows} row(s), rows walk {walk} in tiles of "
                            f"{sig.block_neighbors} neighbours with a degree guard")
        ex.schedule = (f"{self.backend}: block_rows={sig.block_rows}, "
                       f"block_neighbors={sig.block_neighbors}, num_warps={sig.num_warps}, "
                       f"num_stages={sig.num_stages}")
        ex.cache_lines.append(f"triton kernel {self.key[:12]}: " +
                              ("hit (memory)" if self.artifact.imported else
                               "miss (compiled on the first call)"))


def relabel_routes(ex) -> None:
    """explain(): a program whose compiled propagates all run on one Triton backend reports
    that backend as its route (routes.py labels compiled routes cpu-llvm)."""
    compiled = {r for r, _, _ in ex.routes if r != "reference"}
    if len(compiled) == 1 and targets_triton(next(iter(compiled))):
        name = next(iter(compiled))
        fallen = any(r == "reference" for r, _, _ in ex.routes)
        ex.route = "mixed" if fallen else name
        ex.backend = ("fused Triton kernels" + (" in Triton's interpreter (CPU)"
                                                if BACKENDS[name].interpreter else " (CUDA)")
                      + (" + numpy reference interpreter" if fallen else ""))


def split_rows(row_ptr: np.ndarray, split: int):
    """(heavy rows, index of each one's first chunk, chunk rows, chunk first edges) of the
    rows with more than `split` edges, each cut into chunks of `split` edges; None if none."""
    deg = np.diff(row_ptr.astype(np.int64))
    heavy = np.flatnonzero(deg > split)
    if heavy.size == 0:
        return None
    chunks = -(-deg[heavy] // split)
    first = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    chunk_row = np.repeat(heavy, chunks)
    within = np.arange(int(chunks.sum())) - np.repeat(first, chunks)
    chunk_lo = row_ptr.astype(np.int64)[chunk_row] + within * split
    return heavy, first, chunk_row, chunk_lo


def _walks_of(graph) -> dict:
    """The launch tensors kept for `graph` (its walks and split plans, per walk and device),
    in the relation's weak cache."""
    per_graph = memo(graph)
    found = per_graph.get("triton_walks")
    if found is None:
        found = per_graph.setdefault("triton_walks", {})
    return found


def _split_plan(graph, sig, device: str, row_ptr):
    """split_rows of the walked CSR (`row_ptr`: the launch's tensor) as launch tensors,
    cached per relation like the walk."""
    key = ("split", sig.walk, sig.split_degree, device)
    per_graph = _walks_of(graph)
    if key not in per_graph:
        buf = tensors()
        found = split_rows(buf.to_numpy(row_ptr, "int64"), sig.split_degree)
        per_graph[key] = None if found is None else tuple(
            buf.from_array(a, "int64", device) for a in found)
    return per_graph[key]


def _torch_walk(graph, sig, device: str) -> dict:
    """{slot: tensor} of the walk a kernel reads (cached per relation, walk and device)."""
    relation = tuple(sig.relation)
    per_graph = _walks_of(graph)
    found = per_graph.get((sig.walk, relation, device))
    if found is None:
        if relation[0] == "radius" or (getattr(graph, "kind", None) == "knn" and
                                       sig.walk == "dst" and "edge_perm" not in sig.slots):
            found = generated_walk(graph, relation, device)
            per_graph[(sig.walk, relation, device)] = found
            return found
        if relation == ("csr",):
            rp, ci, perm = walked_csr(graph, sig.walk)
            arrays = {"row_ptr": rp, "col_idx": ci, "edge_perm": perm}
        else:
            arrays = dict(walk_arrays(graph, sig)[0])
            if relation[0] in ("stencil", "stencil_t"):
                arrays["stencil_offsets"] = np.asarray(relation[2], np.int64).reshape(-1)
        buf = tensors()
        found = {k: None if a is None else buf.from_array(a, a.dtype.name, device)
                 for k, a in arrays.items()}
        per_graph[(sig.walk, relation, device)] = found
    return found
