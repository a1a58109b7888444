"""core.records.record against dataclasses.dataclass(frozen=True): the same fields, replace,
asdict, constructor errors, repr text, equality and hash values, frozenness and docs.

Oracle: the same class body decorated by dataclasses.dataclass."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from tiga.core.records import record


def _body():
    class Op:
        name: str
        operands: tuple
        attrs: tuple = ()
        hidden: list = dataclasses.field(default_factory=list, repr=False, compare=False)

        def __post_init__(self):
            if not isinstance(self.name, str):
                raise TypeError("name must be a string")

        def size(self) -> int:
            return len(self.operands)
    return Op


Rec = record(_body())
Ref = dataclasses.dataclass(frozen=True)(_body())


@pytest.mark.parametrize("args,kwargs", [(("a", (1, 2)), {}), (("a",), {"operands": (3,)}),
                                         ((), {"name": "b", "operands": (), "attrs": (("k", 1),)}),
                                         (("c", (np.float64("nan"),), ()), {})])
def test_record_behaves_as_a_frozen_dataclass(args, kwargs):
    got, want = Rec(*args, **kwargs), Ref(*args, **kwargs)
    assert repr(got).replace("Rec", "Ref") == repr(want).replace("Rec", "Ref")
    assert hash(got) == hash(want)
    assert got == Rec(*args, **kwargs) and got != want       # (another class)
    assert dataclasses.asdict(got) == dataclasses.asdict(want)
    assert [f.name for f in dataclasses.fields(got)] == ["name", "operands", "attrs", "hidden"]
    assert Rec.__match_args__ == Ref.__match_args__
    changed = dataclasses.replace(got, attrs=(("x", 2),))
    assert changed.attrs == (("x", 2),) and changed.name == got.name
    assert changed.size() == got.size()
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'name'"):
        got.name = "z"
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'name'"):
        del got.name
    assert copy.deepcopy(got) == got and copy.copy(got) == got


def test_record_compares_fields_as_tuples():
    a = np.arange(3)
    assert Rec("a", a) == Rec("a", a)      # (the same array object: tuple identity, no ufunc)
    assert Rec("a", (1,), hidden=[1]) == Rec("a", (1,), hidden=[2])   # compare=False


@pytest.mark.parametrize("args,kwargs,match", [
    ((), {}, "missing required argument: 'name'"),
    (("a",), {}, "missing required argument: 'operands'"),
    (("a", (), (), [], 5), {}, "takes 5 positional arguments but 6 were given"),
    (("a", ()), {"name": "b"}, "multiple values for argument 'name'"),
    (("a", ()), {"colour": 1}, "unexpected keyword argument 'colour'"),
    ((1, ()), {}, "name must be a string"),
])
def test_record_constructor_errors(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        Rec(*args, **kwargs)


def test_record_defaults_factories_docs_and_identity_equality():
    a, b = Rec("a", ()), Rec("a", ())
    assert a.attrs == () and a.hidden == [] and a.hidden is not b.hidden
    assert Rec.__doc__ == "Op(name: 'str', operands: 'tuple', attrs: 'tuple' = (), " \
                          "hidden: 'list')"

    @record(eq=False)
    class Node:
        """An identity-compared record."""

        value: int

    n = Node(1)
    assert n != Node(1) and n == n and hash(n) == object.__hash__(n)
    assert Node.__doc__ == "An identity-compared record."


def test_a_plain_subclass_shares_the_record_methods():
    class Sub(Rec):
        level = "sub"

    s = Sub("a", (1,))
    assert repr(s) == f"{Sub.__qualname__}(name='a', operands=(1,), attrs=())"
    assert s == Sub("a", (1,)) and s != Rec("a", (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "b"


def test_methods_the_class_body_defines_are_kept():
    @record
    class Named:
        name: str

        def __repr__(self):
            return f"<{self.name}>"

        def __eq__(self, other):
            return isinstance(other, Named) and other.name.lower() == self.name.lower()

        def __hash__(self):
            return hash(self.name.lower())

    assert repr(Named("A")) == "<A>" and Named("A") == Named("a")
    assert hash(Named("A")) == hash(Named("a"))
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
        @record
        class Bad:
            x: int

            def __setattr__(self, name, value):
                pass
