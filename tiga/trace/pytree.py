"""trace: pytrees of dicts, tuples, lists and None; flatten to leaves and rebuild."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeDef:
    kind: str  # "leaf" | "none" | "tuple" | "list" | "dict"
    meta: tuple = ()
    children: tuple = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)


LEAF = TreeDef("leaf")


def tree_flatten(tree) -> tuple[list, TreeDef]:
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves) -> TreeDef:
    if tree is None:
        return TreeDef("none")
    if isinstance(tree, (tuple, list)):
        kids = tuple(_flatten(x, leaves) for x in tree)
        return TreeDef("tuple" if isinstance(tree, tuple) else "list", (), kids)
    if isinstance(tree, dict):
        keys = tuple(sorted(tree, key=str))
        return TreeDef("dict", keys, tuple(_flatten(tree[k], leaves) for k in keys))
    leaves.append(tree)
    return LEAF


def tree_unflatten(treedef: TreeDef, leaves) -> object:
    it = iter(leaves)
    out = _build(treedef, it)
    return out


def _build(td: TreeDef, it):
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    kids = [_build(c, it) for c in td.children]
    if td.kind == "tuple":
        return tuple(kids)
    if td.kind == "list":
        return kids
    return dict(zip(td.meta, kids))


def tree_map(fn, tree):
    leaves, td = tree_flatten(tree)
    return tree_unflatten(td, [fn(x) for x in leaves])
