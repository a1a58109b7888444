"""Test-wide settings: every program the suite runs is verified by check_program; hypothesis
profiles (`--hypothesis-profile=ci`, as `make test` runs: every property gets at least
CI_MIN_EXAMPLES examples, whatever its own @settings asks for)."""
import os

os.environ.setdefault("TIGA_CHECK", "1")
# Triton reads this once, at its own import; a test that imports every tiga module (the
# reference walk) may import it first, and the interpreter tests after it need it set.
os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

import tiga  # noqa: E402

tiga.config.check = True

# "ci": no deadline (two shared cores make timings noisy) and a floor of examples per property:
# a property whose @settings asks for fewer (a few examples keep a local run quick) is raised
# to the floor by pytest_collection_modifyitems below; one that asks for more keeps its count.
# "dev" (= hypothesis's default profile) runs each property as its @settings says.
CI_MIN_EXAMPLES = 25
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("dev", settings.get_profile("default"))


def pytest_collection_modifyitems(config, items):
    if settings.get_current_profile_name() != "ci":
        return
    floor = CI_MIN_EXAMPLES
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not getattr(fn, "is_hypothesis_test", False) or _interpreted_gpu_test(item):
            continue
        own = fn._hypothesis_internal_use_settings
        if own.max_examples < floor:
            # hypothesis reads the wrapped test's settings when it runs (not when decorated)
            fn._hypothesis_internal_use_settings = settings(own, max_examples=floor)



def _interpreted_gpu_test(item) -> bool:
    """A tests/gpu property run through Triton's interpreter (no CUDA device): it keeps its
    own example count, chosen for the interpreter's cost (about 30 s an example there); the
    same properties run >= CI_MIN_EXAMPLES examples in tests/triton, and on CUDA the floor
    applies. (tests/gpu/gpu_env.py sets TRITON_INTERPRET as its modules are collected.)"""
    return "gpu" in item.path.parts and os.environ.get("TRITON_INTERPRET") == "1"
