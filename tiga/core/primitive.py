"""core: primitives and the registries core owns (abstract eval, numpy impl, row batching)."""
from __future__ import annotations

from collections.abc import Callable


class Primitive:
    """A named operation of GraphPrograms. Identity is the name; rules live in registries."""

    __slots__ = ("name", "multiple_results", "family")

    def __init__(self, name: str, family: str, multiple_results: bool = False):
        self.name = name
        self.family = family
        self.multiple_results = multiple_results

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (get_primitive, (self.name,))


_ALL: dict[str, Primitive] = {}

# rule kind -> one registry each (DESIGN.md). Signatures are frozen:
#   abstract_eval_rules[p](*in_types, **params) -> list[Type]
#   impl_rules[p](*in_values, **params) -> list[np.ndarray | Graph]
#   row_batch_rules[p](**params) -> params for operands that all carry one extra leading axis
abstract_eval_rules: dict[Primitive, Callable] = {}
impl_rules: dict[Primitive, Callable] = {}
row_batch_rules: dict[Primitive, Callable] = {}


def primitive(name: str, family: str, multiple_results: bool = False) -> Primitive:
    if name in _ALL:
        raise ValueError(f"primitive {name!r} is defined twice")
    p = Primitive(name, family, multiple_results)
    _ALL[name] = p
    return p


def get_primitive(name: str) -> Primitive:
    return _ALL[name]


def all_primitives() -> list[Primitive]:
    return list(_ALL.values())


def elementwise_batch_rule(**params):
    """Elementwise primitives are unchanged by a leading batch axis."""
    return params
