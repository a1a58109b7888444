"""autodiff: VJP rule of dot_general (both operands by contracting the cotangent)."""
from __future__ import annotations

from ...core.prims.linalg import dot_general_p
from ...trace import math as m
from ...trace.math import _typeof
from ..registry import vjp_rules


def _operand_ct(ct, other, x_nd, x_contract, o_contract, x_batch, o_batch, ct_other_free,
                o_free):
    """Cotangent of one operand `x` of dot_general(x, other) (or of (other, x) mirrored).

    Contract ct's axes of `other`'s free dims with those dims of `other`; the result holds
    (batch, x free dims, other's contracted dims in other-axis order); transpose to x's order.
    """
    nb = len(x_batch)
    dims = ((tuple(ct_other_free), tuple(o_free)), (tuple(range(nb)), tuple(o_batch)))
    res = m.dot_general(ct, other, dims)
    x_free = [i for i in range(x_nd) if i not in x_contract and i not in x_batch]
    o_rest = sorted(o_contract)  # dot_general keeps other's leftover axes in axis order
    x_from_o = {oc: xc for xc, oc in zip(x_contract, o_contract)}
    order = list(x_batch) + x_free + [x_from_o[o] for o in o_rest]
    perm = [order.index(i) for i in range(x_nd)]
    return m.transpose(res, tuple(perm))


def dot_general_vjp_rule(ct, out, x, y, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    tx, ty = _typeof(x), _typeof(y)
    nb = len(lb)
    n_lfree = tx.ndim - len(lc) - len(lb)
    lfree_ct = list(range(nb, nb + n_lfree))
    rfree_ct = list(range(nb + n_lfree, _typeof(ct).ndim))
    rfree_y = [i for i in range(ty.ndim) if i not in rc and i not in rb]
    lfree_x = [i for i in range(tx.ndim) if i not in lc and i not in lb]
    cx = _operand_ct(ct, y, tx.ndim, lc, rc, lb, rb, rfree_ct, rfree_y)
    cy = _operand_ct(ct, x, ty.ndim, rc, lc, rb, lb, lfree_ct, lfree_x)
    return (m.convert(cx, tx.dtype) if tx.dtype.is_float else None,
            m.convert(cy, ty.dtype) if ty.dtype.is_float else None)


vjp_rules[dot_general_p] = dot_general_vjp_rule
