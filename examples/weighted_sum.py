"""Example: the report's WeightedSum listing ("Relations, fields and messages").

Runs the same message-passing program twice: on numpy inputs with `tg.grad`, and (when torch
is installed) on torch tensors with `torch.autograd.grad`, whose backward runs Tiga's own VJP
program. Checks y, dx and dw for both and prints a one-line summary; with
TIGA_DEMO_VERBOSE=1 also each value, the typed GraphProgram and the route report.

    .venv/bin/python examples/weighted_sum.py
"""
from __future__ import annotations

import os

import numpy as np

import tiga as tg

# The report's documented result for this graph and these inputs.
EXPECTED = {"y": [23.0, 6.0, 0.0], "dx": [4.0, 7.0], "dw": [2.0, 3.0, 3.0]}
VERBOSE = os.environ.get("TIGA_DEMO_VERBOSE") == "1"
say = print if VERBOSE else (lambda *args: None)


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def check(label: str, y, dx, dw) -> None:
    got = {"y": y, "dx": dx, "dw": dw}
    for name, value in got.items():
        say(f"{label:>5} {name:<2} = {np.asarray(value).tolist()}")
        np.testing.assert_array_equal(np.asarray(value), EXPECTED[name], err_msg=name)


def run_numpy() -> str:
    """Checks the numpy route; returns the route the call took."""
    # Destination-oriented CSR: destination 0 reads sources 0 and 1, destination 1 reads
    # source 1, destination 2 has no edges (an empty row finalizes to the sum identity, 0).
    graph = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2,
                              validate="full")
    x = np.array([2.0, 3.0])
    w = np.array([4.0, 5.0, 2.0])
    layer = WeightedSum()
    y = layer(graph=graph, src={"x": x}, dst={}, edge={"w": w})

    def loss(x, w):
        return layer(graph=graph, src={"x": x}, dst={}, edge={"w": w}).sum()

    dx, dw = tg.grad(loss, argnums=(0, 1))(x, w)
    check("numpy", y, dx, dw)

    program = tg.make_program(lambda x, w: layer(graph=graph, src={"x": x}, dst={},
                                                 edge={"w": w}))(x, w)
    say("\nGraphProgram:")
    say(program)
    # Explains this call (route, traversal, what is materialised) without running it.
    explanation = layer.explain(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    say("\nRoute (explain):")
    say(str(explanation))
    return explanation.route


def run_torch() -> bool:
    """Checks the torch route; False when torch is not installed."""
    try:
        import torch
    except ImportError:
        say("\ntorch is not installed: skipping the torch.autograd part")
        return False
    graph = tg.Graph.from_csr(torch.tensor([0, 2, 3, 3]), torch.tensor([0, 1, 1]),
                              num_src=2, validate="full")
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], requires_grad=True)
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    assert isinstance(y, torch.Tensor) and y.grad_fn is not None
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    say()
    check("torch", y.detach(), dx, dw)
    return True


def main() -> None:
    route = run_numpy()
    # the values worked out by hand in the docstring's listing are what both routes match
    how = "numpy, torch" if run_torch() else "numpy; no torch"
    print(f"weighted sum: y {EXPECTED['y']}, dx {EXPECTED['dx']}, dw {EXPECTED['dw']} "
          f"= by hand ({how})")
    say(f"route: {route}")
    say("\nok")


if __name__ == "__main__":
    main()
