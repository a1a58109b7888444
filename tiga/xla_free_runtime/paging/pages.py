"""runtime: what the pages of a paged run are: page row and edge ranges, how they walk the
relation (by destination over the stored CSR, by source over its transpose), where each
field's rows are read from, where the result goes and how many loader threads a run takes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ...core.program import Var
from ..caches.equations import memo
from ..calls.threads import num_threads
from ..memory import scope as sc
from ..memory.tiers import HostStorage
from ..memory.tiers.files import page_cache_room
from ..store import transpose as store_transpose

PAGED_BY = ("dst", "edge")    # groupings a page of destination rows completes on its own


QUEUE_PAGES = 2     # pages loaded ahead of the loaders' current ones


LOADERS = 2         # loader threads: file reads, checksums and numpy copies release the GIL


LOOKAHEAD = QUEUE_PAGES + LOADERS      # launches a page's transfers are issued ahead of it


@dataclass(frozen=True)
class PageTask:
    """One page: destination rows [rows), edges [edges) of the stored CSR."""

    index: int
    rows: tuple
    edges: tuple


@dataclass
class PageStats:
    """What the last paged run on a relation measured (explain() prints it)."""

    pages: int = 0
    page_rows: int = 0
    edges: int = 0
    distinct_sources: int = 0
    bytes_read: dict = field(default_factory=lambda: {"host": 0, "disk": 0})
    bytes_written: dict = field(default_factory=lambda: {"host": 0, "disk": 0})
    bytes_device: dict = field(default_factory=lambda: {"to": 0, "from": 0})
    seconds: dict = field(default_factory=lambda: dict.fromkeys(
        ("read", "gather", "compute", "write", "wait", "device", "total"), 0.0))
    result_tier: str = "host"
    route: str = "cpu-llvm"           # the backend the page kernel ran on
    mapped: bool = False              # pages read from the page cache in place (mapped.py)
    module: object = None             # the page plan's Task module that ran

    @property
    def distinct_ratio(self) -> float:
        return self.distinct_sources / self.edges if self.edges else 0.0

    @property
    def overlapped(self) -> float:
        """Seconds of page loading hidden behind compute."""
        s = self.seconds
        return max(0.0, s["read"] + s["gather"] - s["wait"])


def page_tasks(num_dst: int, bounds: np.ndarray, page_rows: int) -> list:
    """The plan: one PageTask per `page_rows` destination rows; `bounds` is row_ptr at
    rows 0, page_rows, 2 page_rows, ... and num_dst."""
    starts = list(range(0, num_dst, page_rows))
    return [PageTask(k, (a, min(a + page_rows, num_dst)), (int(bounds[k]), int(bounds[k + 1])))
            for k, a in enumerate(starts)]


def tier_of(rows) -> str:
    """Where a relation's rows (a store version, resident_pages.ResidentRows) or its edge
    permutation are read from."""
    return getattr(rows, "tier", "disk")


def storage_of(value):
    """(storage with read_rows / take_rows, tier) of a field value on any tier."""
    st = getattr(value, "_storage", None)
    if st is not None and hasattr(st, "take_rows"):
        return st, st.tier
    arr = np.asarray(value)
    return HostStorage(arr), "host"


def row_layout(stor) -> tuple:
    """(row shape, numpy dtype) of a storage on any tier."""
    arr = stor._live() if stor.tier == "host" else stor
    return tuple(arr.shape[1:]), np.dtype(arr.dtype)


@dataclass(frozen=True)
class Walk:
    """How pages traverse the relation: by destination (the stored CSR) or by source (its
    transpose, whose kernel is the destination-grouped one with the roles exchanged)."""

    reader: object        # read_rows(a, b) / page_bounds(rows) over the walked rows
    rows: str             # role of the walked rows: "dst" or "src"
    gathered: str         # role gathered distinct once per page: the other endpoint
    eqn: object           # the equation the page kernel runs
    edge_perm: object     # None, or the stored edge id of each transposed edge
    lead: int | None      # rows of the result (None: one value summed over pages)


def pageable(params) -> bool:
    by = params["reduce_by"]
    return by in PAGED_BY or by == "src" or (by == "all" and params["reducer"].builtin and
                                             params["reducer"].name == "sum")


def walk_of(eqn, graph, build: bool = True, reader=None):
    """The page walk of `eqn` over the paged relation (over `reader`'s rows when given), or
    None (read the CSR whole). build=False: a missing transposed relation is not built (the
    walk's reader is None)."""
    p = eqn.params
    if not pageable(p):
        return None
    reader = reader or graph.params["reader"]
    if p["reduce_by"] != "src":
        lead = {"dst": graph.num_dst, "edge": graph.num_edges, "all": None}[p["reduce_by"]]
        # (a relation held in memory may store its edges out of their id order)
        return Walk(reader, "dst", "src", eqn, getattr(reader, "edge_perm", None), lead)
    if reader.transposed is None and build:    # built once; later opens find it stored
        reader = store_transpose.build(reader)
        graph.params.update(reader=reader, version=reader.version)
    t = reader.transposed
    return Walk(t, "src", "dst", walked_eqn(eqn), getattr(t, "edge_perm", None), graph.num_src)


def walked_eqn(eqn):
    """The equation a page walk runs: `eqn`, or a source-grouped one as the destination-
    grouped equation over the transposed relation (one object per equation: its one-page
    Task module is looked up by it)."""
    if eqn.params["reduce_by"] != "src":
        return eqn
    entry = memo(eqn)
    swapped = entry.get("page_walk")
    if swapped is None:
        swapped = entry["page_walk"] = _swapped(eqn)
    return swapped


def _swapped(eqn):
    """A propagate grouped by source as one grouped by destination over the transposed
    relation: the roles (and the relation type's endpoints) exchanged. The edge function
    takes its operands by position, so only the labels change."""
    p, gt = eqn.params, eqn.inputs[0].type
    flip = {"src": "dst", "dst": "src"}
    relation = Var(dataclasses.replace(gt, num_src=gt.num_dst, num_dst=gt.num_src))
    return dataclasses.replace(eqn, inputs=(relation,) + tuple(eqn.inputs[1:]), params=dict(
        p, roles=tuple(flip.get(r, r) for r in p["roles"]), reduce_by="dst"))


def result_layout(eqn, walk) -> tuple:
    """(shapes, types, on disk?) of the results: on disk when they would not fit the host
    budget with a quarter of it left for the page buffers."""
    lead = walk.lead
    types = [v.type for v in eqn.outputs]
    shapes = [tuple(int(d) for d in t.shape) if lead is None else
              (lead,) + tuple(int(d) for d in t.shape[1:]) for t in types]
    total = sum(int(np.prod(s, dtype=np.int64)) * t.dtype.np.itemsize
                for s, t in zip(shapes, types))
    owner = sc.budget_scope("host")
    on_disk = (owner is not None and lead is not None and
        owner.used["host"] + total > owner.budgets["host"] - owner.budgets["host"] // 4)
    return shapes, types, on_disk


def reads_past_cache(walk: Walk, fields: list) -> bool:
    """Whether a run reads more from disk than the page cache could keep (half of what the
    kernel could give it): its cold chunks are then read past the cache (chunk_checks),
    which a next call could not have been served from anyway. `fields`: (storage, tier) of
    each propagate field."""
    disk = sum(stor.nbytes for stor, tier in fields if tier == "disk")
    for rows in (walk.reader, walk.edge_perm):
        if rows is not None and tier_of(rows) == "disk":
            disk += getattr(rows, "nbytes", 0)
    room = page_cache_room()
    return room is not None and disk > room // 2


def page_threads(walk: Walk, pages: int, mapped: bool = False) -> tuple:
    """(loader threads, threads of a page's kernel) of a run of `pages` pages (`mapped`:
    read from the page cache in place, mapped.py)."""
    # a sum over all edges adds pages in plan order (one loader: the same float sum on
    # every run); other results are written to disjoint rows, in any order, so each
    # loader walks its own contiguous run of pages: a chunk shared by two neighbouring
    # pages is then decoded once, by the loader that reads both
    n = max(1, min(LOADERS, pages)) if walk.lead is not None else 1
    # the loaders keep cores busy reading, so a page's kernel takes the cores left; mapped
    # pages' loaders only check their chunks, a small share of a core
    return n, num_threads() if mapped else max(1, num_threads() - n)
