"""lower: the kernel ABI every backend shares: how a rendered kernel is called.

One definition, read by both renderers (lower/llvm, lower/triton) and by every runtime
launcher:

- **operand roles**: each field operand of a propagate is a row of its `src`, `dst` or
  `edge` entity, or a whole `param`; a kernel walks the rows of one role (ROW_ROLE, by
  reduce_by) and gathers its neighbours' rows (NBR_ROLE).
- **relation descriptors**: `relation_descriptor(graph, walk, target=...)` is the walk a
  target's kernel takes over a relation: a tuple naming its kind and layout constants
  (("csr",), ("dense",), ("cu_seqlens", causal), ("stencil", shape, offsets, periodic),
  ("radius", dims), and by source their transposes or ("csr_rows",)). It names the kernel's
  walk slots and is part of every kernel's cache key. A relation no walk of the target
  expresses is walked through its resolved CSR, ("csr",).
- **KernelSignature**: the symbol and the ordered pointer operands (`slots`: the walk's
  arrays, `edge_perm`, `field:i`, `out:k`) with every field's role, row shape and dtype and
  every output's, plus the launch knobs of the target that rendered it. JSON-serialisable:
  the disk caches store it next to the artifact, tagged with ABI_VERSION.
- **KernelSource**: the rendered text and its signature, what a renderer hands a launcher.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from ..core.prims.graph import propagate_abstract_eval_rule
from .schedule import sparse_sources

# written into every serialised signature; a stored signature of another version is refused
# (the cache keys also hash tiga/lower's sources, so a changed ABI is never looked up)
ABI_VERSION = 1
TARGETS = ("cpu-llvm", "triton")

# ---- operand roles ---------------------------------------------------------------------

FIELD_ROLES = ("src", "dst", "edge", "param")
ROW_ROLE = {"dst": "dst", "src": "src", "edge": "dst", "all": "dst"}   # by reduce_by
NBR_ROLE = {"dst": "src", "src": "dst"}                                # by row role
EDGE_PERM = "edge_perm"   # the slot of the walked order's edge ids (user edge order)


def walk_of(reduce_by: str) -> str:
    """The rows a kernel walks: sources for reduce_by="src" (the transposed relation), else
    destinations (edge and all walk the destination rows too)."""
    return "src" if reduce_by == "src" else "dst"


def field_slot(i: int) -> str:
    return f"field:{i}"


def out_slot(k: int) -> str:
    return f"out:{k}"


def operand_slots(walk_slots: tuple, has_perm: bool, n_fields: int, n_outs: int) -> tuple:
    """A propagate kernel's pointer operands in call order: the walk's arrays, the edge
    permutation when the walk has one, the fields, the outputs."""
    return tuple(walk_slots) + ((EDGE_PERM,) if has_perm else ()) + tuple(
        field_slot(i) for i in range(n_fields)) + tuple(out_slot(k) for k in range(n_outs))


def propagate_operands(params: dict, graph_t, field_types: list) -> dict:
    """The operand part of a propagate kernel's signature (KernelSignature keywords): each
    field's role, row shape (a parameter's whole shape) and dtype, and each output's (an
    output of reduce_by="all" is whole), from the equation's abstract evaluation."""
    outs = propagate_abstract_eval_rule(graph_t, *field_types, **params)
    roles = tuple(params["roles"])
    whole = params["reduce_by"] == "all"
    return dict(roles=roles,
                field_shapes=tuple(tuple(t.shape) if r == "param" else tuple(t.shape[1:])
                                   for t, r in zip(field_types, roles)),
                field_dtypes=tuple(t.dtype.name for t in field_types),
                out_shapes=tuple(tuple(t.shape) if whole else tuple(t.shape[1:])
                                 for t in outs),
                out_dtypes=tuple(t.dtype.name for t in outs))


# ---- relation descriptors --------------------------------------------------------------

IMPLICIT_KINDS = ("dense", "triangular", "cu_seqlens", "stencil")
TRANSPOSED_KINDS = ("dense_t", "triangular_t", "cu_seqlens_t", "stencil_t", "csr_rows")
MAX_STENCIL_OFFSETS = 64   # offsets are unrolled in the generated code
RADIUS_MAX_DIMS = 3        # 3^dims neighbour cells per row; higher dims resolve to CSR
_CSR = ("csr",)            # a relation walked through its resolved (or stored) CSR
# the walks each target renders; any other relation is walked through its resolved CSR
NATIVE_WALKS = {
    "cpu-llvm": frozenset(("csr",) + IMPLICIT_KINDS + TRANSPOSED_KINDS),
    # (the radius cell walk: cpu-llvm's generated walks run through lower/llvm/generated.py)
    "triton": frozenset(("csr", "radius") + IMPLICIT_KINDS + TRANSPOSED_KINDS),
}
# triton's stencil walks load their offsets from a K x d array, which K = 0 does not have
_STENCIL_NEEDS_OFFSETS = frozenset({"triton"})
# traversals whose walk the Kernel IR text names completely (rendered from text alone)
TEXT_RELATIONS = {"csr-row": ("csr",), "transposed-csr-row": ("csr",),
                  "dense-row": ("dense",), "triangular-row": ("triangular",),
                  "transposed-dense-row": ("dense_t",),
                  "transposed-triangular-row": ("triangular_t",)}


def relation_descriptor(graph, walk: str, *, target: str) -> tuple:
    """How `target`'s kernel walks this relation grouped by `walk` ("dst": rows are
    destinations; "src": the transposed relation). Part of every kernel's cache key."""
    native = NATIVE_WALKS.get(target)
    if native is None:
        raise ValueError(f"relation_descriptor: target is {target!r}, expected one of "
                         f"{', '.join(NATIVE_WALKS)}")
    found = _described(graph, walk)
    if found == _CSR:   # (the common case, asked on every warm call: nothing else to check)
        return found
    kind = found[0]
    if kind not in native or (kind in ("stencil", "stencil_t") and not found[2] and
                              target in _STENCIL_NEEDS_OFFSETS):
        return _CSR
    return found


def _described(graph, walk: str) -> tuple:
    """The most specific walk of a relation, before a target's capabilities."""
    kind = getattr(graph, "kind", "csr")
    if kind == "radius":
        return _radius(getattr(graph, "params", None) or {}, walk)
    if walk != "dst":
        forward = _described(graph, "dst")
        if forward[0] != "csr":   # the implicit kinds' transposed walks
            return (forward[0] + "_t",) + tuple(forward[1:])
        sparse = kind in ("csr", "cat") and sparse_sources(getattr(graph, "num_src", None),
                                                           getattr(graph, "num_edges", None))
        return ("csr_rows",) if sparse else _CSR
    if kind not in IMPLICIT_KINDS:
        return _CSR
    params = getattr(graph, "params", None) or {}
    if kind == "cu_seqlens":
        return ("cu_seqlens", bool(params["causal"]))
    if kind == "stencil":
        shape = tuple(int(n) for n in params["shape"])
        offsets = tuple(tuple(int(o) for o in off) for off in params["offsets"])
        if len(offsets) > MAX_STENCIL_OFFSETS or 0 in shape:
            return _CSR
        return ("stencil", shape, offsets, bool(params["periodic"]))
    return (kind,)


def _radius(params: dict, walk: str) -> tuple:
    """The radius cell walk, where it is exact without numbering edges in the reference's
    order: no max_neighbors (nearest-first truncation), at most RADIUS_MAX_DIMS dims, and by
    source only over one point set (symmetric)."""
    dims = int(params["dims"])
    if (params.get("max_neighbors") is not None or not 1 <= dims <= RADIUS_MAX_DIMS or
            (walk != "dst" and params.get("query") is not None)):
        return ("csr",)
    return ("radius", dims)


def radius_descriptor_of_launch(coord_dims, reduce_by: str, roles: tuple) -> tuple:
    """The walk of a cell-directory launch from its Kernel IR alone (program.ir): the cell
    walk where the runtime takes it for some radius relation of that shape (max_neighbors,
    which the IR does not carry, walks the resolved CSR)."""
    if (type(coord_dims) is not int or not 1 <= coord_dims <= RADIUS_MAX_DIMS or
             reduce_by == "edge" or "edge" in roles):
        return ("csr",)
    return ("radius", coord_dims)


# ---- signature and source --------------------------------------------------------------

@dataclass(frozen=True)
class KernelSignature:
    """How a runtime calls one rendered kernel. The fields up to `relation` are every
    target's; the launch knobs after it are read by the target that rendered the kernel
    (the other target's keep their defaults)."""

    target: str              # TARGETS: the renderer that produced the kernel
    symbol: str              # entry point (cpu-llvm adds `<symbol>_drive`; triton's split
    #                          path `<symbol>_part` / `<symbol>_comb`)
    walk: str                # walk_of(reduce_by): "dst" rows, or "src" (transposed)
    reduce_by: str
    slots: tuple             # pointer operands in call order (operand_slots)
    roles: tuple             # FIELD_ROLES entry of each field operand
    field_shapes: tuple      # row shape per field (whole shape for parameters)
    field_dtypes: tuple
    out_shapes: tuple        # row shape per output (whole for reduce_by="all")
    out_dtypes: tuple
    index_dtype: str
    relation: tuple = ("csr",)   # relation_descriptor: the walk; slots follow it
    # cpu-llvm: "rows": any row chunks; "partial_sums": reduce_by="all" with sum, each chunk
    # folds into its own output and the runtime adds them; "single": one call over all rows
    parallel: str = "rows"
    # triton: the launch grid's rows per program and the meta-parameters of the schedule
    block_rows: int = 1
    block_neighbors: int = 16
    num_warps: int = 4
    num_stages: int = 1
    combine: str = ""        # reduce_by="all": "sum" | "mean" of the per-row partials
    split_degree: int = 0    # > 0: `<symbol>_part` / `<symbol>_comb` run the heavier rows
    split_states: tuple = ()  # (padded elements, dtype) of each reducer state tile

    def to_json(self) -> str:
        return json.dumps(dict(asdict(self), abi=ABI_VERSION), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KernelSignature:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict) -> KernelSignature:
        """The signature `to_json` wrote (JSON lists back to tuples). ValueError for another
        ABI version, a field set that is not this one's or an unknown target: a stored
        artifact described by it is not loaded."""
        data = dict(data)
        version = data.pop("abi", None)
        if version != ABI_VERSION:
            raise ValueError(f"kernel signature: ABI version {version!r}, expected "
                             f"{ABI_VERSION}")
        names = {f.name for f in fields(cls)}
        if set(data) != names or data["target"] not in TARGETS:
            raise ValueError(f"kernel signature: fields {sorted(data)} (target "
                             f"{data.get('target')!r}) do not match ABI {ABI_VERSION}")
        return cls(**{k: _tuples(v) for k, v in data.items()})


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: its text (LLVM IR for cpu-llvm; a Python module of @triton.jit
    functions for triton) and the signature its launcher calls it by."""

    text: str
    signature: KernelSignature
