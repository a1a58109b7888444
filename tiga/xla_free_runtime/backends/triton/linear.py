"""runtime: entity-level linear layers (a program's 2-D `dot_general`s: the rows
opt.hoist_linear moves out of an edge MLP, `Z = X W`, and their VJP's `dX = dZ W^T`,
`dW = X^T dZ`) on the Triton backends, as tile_matmul launches (lower/triton/linear.py).

`dot_rule(eqn, values)` has the executor's override signature (core.eval.run_eqn): it runs
the product on the launch device and returns [C], or returns None (the numpy impl rule runs
it) for anything else: another backend, operands that are not two matrices contracted over
one axis each, non-float or mixed-kind operands, or, on the GPU, a product whose operands
are all on the host (a weight-only product: parameter-only work is host work). Under the
GPU backend the operands a compiled propagate left on the device stay there and a host
weight is copied to it (a few KB); under triton-interpreter it runs on CPU tensors with
the result handed back as numpy, as every Triton kernel there.
"""
from __future__ import annotations

import numpy as np

from ....core.eval import on_device
from ....lower.backends import BACKENDS, selected_backend, targets_triton
from ....lower.schedule import triton_dot_precision, triton_matmul_blocks
from ....lower.triton.linear import linear_source
from ...reports.runs import COUNTERS
from .attention import HALF, operand_types, tf32_allowed
from .compile import launch_fixed, launch_result, tensors

FLOATS = ("float16", "bfloat16", "float32", "float64")


def dot_rule(eqn, values: list):
    """[x @ y] of a 2-D dot_general on the selected Triton backend, else None."""
    backend = selected_backend()
    if not targets_triton(backend) or len(values) != 2:
        return None
    interp = BACKENDS[backend].interpreter
    if not interp and not any(on_device(v) for v in values):
        return None
    form = _form(eqn)
    if form is None:
        return None
    out = eqn.outputs[0].type.dtype.name
    return [matmul(values[0], values[1], form, out, backend)]


def _form(eqn):
    """(lc, rc): the contracted axis of each 2-D float operand, or None."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    x, y = (a.type for a in eqn.inputs)
    if (lb or rb or len(lc) != 1 or len(rc) != 1 or getattr(x, "ndim", 0) != 2
            or getattr(y, "ndim", 0) != 2):
        return None
    if (x.dtype.name not in FLOATS or y.dtype.name not in FLOATS
            or eqn.outputs[0].type.dtype.name not in FLOATS):
        return None
    return int(lc[0]), int(rc[0])


def matmul(x, y, form: tuple, out: str, backend: str):
    """C = x . y contracted over x's axis form[0] and y's axis form[1], C in dtype `out`."""
    buf = tensors()
    interp = BACKENDS[backend].interpreter
    device = "cpu" if interp else "cuda"
    ct, it = operand_types({_name(x), _name(y)}, interp)
    a = buf.from_array(x, _name(x), device)
    b = buf.from_array(y, _name(y), device)
    lc, rc = form
    (s0, s1), (t0, t1) = tuple(x.shape), tuple(y.shape)
    # A as (M, K) and B as (K, N) through the row-major strides of the stored matrices
    m, k, sam, sak = (s0, s1, s1, 1) if lc == 1 else (s1, s0, 1, s1)
    n, sbk, sbn = (t1, t1, 1) if rc == 0 else (t0, 1, t1)
    c = buf.zeros((m, n), out, device)
    if m and n:
        bm, bn, bk, warps, stages = triton_matmul_blocks(
            m, n, k, 2 if it in HALF else np.dtype(it).itemsize, interp)
        import triton.language as tl

        launch_fixed(linear_source(), "linear", backend, "tile_matmul",
                     (-(-m // bm), -(-n // bn)), (a, b, c, m, n, k, sam, sak, sbk, sbn),
                     dict(IT=getattr(tl, it), CT=getattr(tl, ct),
                          PREC=triton_dot_precision(it, tf32_allowed()), BLOCK_M=bm,
                          BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages))
        COUNTERS["tile_matmuls"] += 1
    return launch_result(buf, c, out, device)


def _name(x) -> str:
    return str(x.dtype).replace("torch.", "")
