"""eval_program's rule overrides: the one interpreter loop the runtime runs programs through."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import tiga as tg
from tiga.core.primitive import impl_rules


def _program(x):
    return tg.make_program(lambda a: tg.math.sin(a) * 2.0 + tg.math.sin(a + 1.0))(x)


@settings(max_examples=25, deadline=None)
@given(x=arrays(np.float64, st.integers(1, 6), elements=st.floats(-3, 3)))
def test_override_by_primitive_replaces_only_that_rule(x):
    program = _program(x)
    sin_p = next(e.primitive for e in program.eqns if e.primitive.name == "sin")
    seen = []

    def cos_instead(eqn, vals):
        seen.append(eqn)
        return [np.cos(vals[0])]

    got = tg.eval_program(program, x, overrides={sin_p: cos_instead})[0]
    np.testing.assert_allclose(got, np.cos(x) * 2.0 + np.cos(x + 1.0))   # numpy oracle
    assert len(seen) == 2
    # no overrides: the impl rules, as before
    np.testing.assert_allclose(tg.eval_program(program, x)[0],
                               np.sin(x) * 2.0 + np.sin(x + 1.0))


def test_none_falls_back_to_the_impl_rule_and_an_equation_id_wins():
    x = np.linspace(-1.0, 1.0, 5)
    program = _program(x)
    sins = [e for e in program.eqns if e.primitive.name == "sin"]
    calls = []

    def decline(eqn, vals):
        calls.append(eqn.primitive.name)
        return None

    both = {e.primitive: decline for e in program.eqns}
    np.testing.assert_allclose(tg.eval_program(program, x, overrides=both)[0],
                               tg.eval_program(program, x)[0])
    assert len(calls) == len(program.eqns)
    first_only = {sins[0].primitive: decline,
                  id(sins[0]): lambda eqn, vals: [impl_rules[eqn.primitive](*vals)[0] * 0.0]}
    got = tg.eval_program(program, x, overrides=first_only)[0]
    np.testing.assert_allclose(got, np.sin(x + 1.0))   # the first sin was zeroed by its id


class FakeDeviceTensor:
    """What a compiled GPU propagate leaves for the next equation: a torch-like tensor whose
    device is not the host (core reads it by duck typing; copies are counted)."""

    device = type("Device", (), {"type": "cuda"})()

    def __init__(self, data):
        self.data, self.copies = np.asarray(data), 0

    def detach(self):
        return self

    def cpu(self):
        self.copies += 1
        return self

    def numpy(self):
        return self.data


def test_device_values_stay_for_overrides_and_reach_impl_rules_as_numpy():
    x = np.linspace(-1.0, 1.0, 5)
    program = _program(x)
    sin_p = next(e.primitive for e in program.eqns if e.primitive.name == "sin")
    dev = FakeDeviceTensor(x)
    seen = []

    def on_device(eqn, vals):   # a compiled route: receives the device value as it is
        seen.append(type(vals[0]))
        return [FakeDeviceTensor(np.sin(np.asarray(vals[0].data if hasattr(vals[0], "data")
                                                   else vals[0])))]

    got = tg.eval_program(program, dev, overrides={sin_p: on_device})[0]
    np.testing.assert_allclose(got, np.sin(x) * 2.0 + np.sin(x + 1.0))   # numpy oracle
    assert seen[0] is FakeDeviceTensor      # the program's input reached the override as is
    assert dev.copies == 1                  # one copy to the host, for the impl rule of `+ 1`
    # the reference interpreter alone (no overrides) binds it as numpy up front
    np.testing.assert_allclose(tg.eval_program(program, FakeDeviceTensor(x))[0],
                               np.sin(x) * 2.0 + np.sin(x + 1.0))
