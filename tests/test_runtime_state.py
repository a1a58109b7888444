"""Issue 37, item 5: the runtime keeps little module-level state. Counted from the source:
a module-level name bound at import to a container or an instance (a dict, a list, a set, a
constructed object) that some function of the same module mutates (item assignment or
deletion, a mutating method, `global`); constants that nothing mutates, context variables and
locks are not state. At most 20, each a cache keyed by value or a registry."""
from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "tiga" / "xla_free_runtime"
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
            "setdefault", "add", "discard", "__setitem__", "__delitem__", "move_to_end",
            "appendleft", "popleft", "put", "submit", "register", "release", "get"}
NOT_STATE = {"Lock", "RLock", "ContextVar", "CFUNCTYPE", "Condition", "Event"}


def _bound(tree: ast.Module) -> dict:
    """{name: line} of module-level names bound to a container or a constructed object."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        container = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp,
                                       ast.ListComp, ast.SetComp))
        if isinstance(value, ast.Call):
            f = value.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            container = name not in NOT_STATE and (name in ("dict", "list", "set")
                                                   or name[:1].isupper())
        for t in targets:
            if container and isinstance(t, ast.Name) and t.id != "__all__":
                out[t.id] = node.lineno
    return out


def _mutated(tree: ast.Module, names: set) -> set:
    """The names of `names` some function of the module mutates."""
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found |= names & set(node.names)
            elif isinstance(node, (ast.Subscript,)) and isinstance(node.ctx, (ast.Store,
                                                                             ast.Del)):
                if isinstance(node.value, ast.Name) and node.value.id in names:
                    found.add(node.value.id)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in names and node.func.attr in MUTATORS
                  and node.func.attr != "get"):
                found.add(node.func.value.id)
    return found


def _imported_as(tree: ast.Module) -> dict:
    """{local name: imported name} of a module's `from ... import` statements."""
    return {(a.asname or a.name): a.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) for a in node.names}


def runtime_state() -> list:
    trees = {path: ast.parse(path.read_text()) for path in sorted(RUNTIME.rglob("*.py"))}
    # mutated anywhere in the runtime: in the defining module, or where it is imported (a
    # registry one module fills for another)
    elsewhere: set = set()
    for tree in trees.values():
        alias = _imported_as(tree)
        elsewhere |= {alias[n] for n in _mutated(tree, set(alias))}
    out = []
    for path, tree in trees.items():
        bound = _bound(tree)
        objects = {n for n in bound if not _literal(tree, n)}   # constructed: state by nature
        mutated = _mutated(tree, set(bound)) | (set(bound) & elsewhere)
        for name in sorted(mutated | objects):
            out.append(f"{path.relative_to(RUNTIME)}:{bound[name]} {name}")
    return out


def _literal(tree: ast.Module, name: str) -> bool:
    """Whether `name` is bound to a literal container or dict()/list()/set() (state only
    if a function mutates it), rather than to a constructed object (state by nature: it is
    mutated through its own methods)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            v = node.value
            if isinstance(v, ast.Call):
                f = v.func
                return (f.id if isinstance(f, ast.Name) else "") in ("dict", "list", "set")
            return True
    return True


def test_the_runtime_keeps_at_most_twenty_mutable_module_objects():
    state = runtime_state()
    assert len(state) <= 20, "\n".join(state)


def test_the_count_sees_state():
    """The counter finds a mutated dict and a constructed object, and passes a constant."""
    tree = ast.parse("A = {}\nB = {'x': 1}\nC = Thing()\n"
                     "def f(k):\n    A[k] = B['x']\n")
    bound = _bound(tree)
    assert set(bound) == {"A", "B", "C"}
    assert _mutated(tree, set(bound)) == {"A"}
    assert not _literal(tree, "C") and _literal(tree, "B")
