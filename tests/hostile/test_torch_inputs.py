"""Hostile torch inputs (issue 13): sparse, meta and nested tensors get messages about layout
or device (not dtype); torch functions on traced values hint at tg.math. Skipped without
torch. One subprocess per group (see _run.py)."""
from __future__ import annotations

import pytest

from ._run import check_cases

pytest.importorskip("torch")

COMMON = '''
import torch
warnings.simplefilter("ignore")   # torch's prototype warnings for nested / sparse CSR tensors
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)

class Sum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x

def call(x):
    return Sum()(graph=g, src={"x": x})
'''


LAYOUTS_AND_DEVICES_ARE_NAMED = COMMON + '''
UE = tg.UnsupportedError

@case
def sparse_coo_field():
    x = torch.eye(2, dtype=torch.float64).to_sparse()
    err = raises(UE, lambda: call(x), "src.x: torch tensor has layout torch.sparse_coo",
                 "expected torch.strided")
    assert "dtype" not in str(err) and ".to_dense()" in err.hint

@case
def sparse_csr_field():
    x = torch.eye(2).to_sparse_csr()
    raises(UE, lambda: call(x), "src.x: torch tensor has layout torch.sparse_csr")

@case
def meta_field():
    raises(UE, lambda: call(torch.empty(2, device="meta")),
           "src.x: torch tensor is on the meta device and holds no data")

@case
def nested_field():
    x = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    raises(UE, lambda: call(x), "src.x: is a nested torch tensor (ragged rows)")

@case
def layout_checked_for_keyword_operands_too():
    m = tg.propagate
    raises(UE, lambda: m(g, lambda s, d, e, w: s.x * w, tg.sum(), src={"x": torch.ones(2)},
                         w=torch.ones(2).to_sparse()), "w: torch tensor has layout")

@case
def graph_arrays():
    GVE = tg.GraphValidationError
    raises(GVE, lambda: tg.Graph.from_csr(torch.tensor([0, 1]).to_sparse(), [0]),
           "row_ptr: torch tensor has layout torch.sparse_coo")
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], torch.tensor([0], device="meta")),
           "col_idx: torch tensor is on the meta device")
    raises(GVE, lambda: tg.Graph.radius(torch.empty(3, 2, device="meta"), 1.0),
           "positions: torch tensor is on the meta device")

@case
def unsupported_torch_dtype_names_the_field():
    raises(tg.DTypeError, lambda: call(torch.ones(2, dtype=torch.complex64)),
           "src.x: torch dtype torch.complex64 is not supported")

@case
def dense_views_give_the_reference_answer():
    base = torch.arange(12.0, dtype=torch.float64).reshape(2, 6)
    for x in (base[:, ::2], base.t().contiguous().t(), torch.flip(base, [1])):
        got = call(x)
        want = Sum().reference(graph=g, src={"x": x.numpy().copy()})
        same(got.numpy(), np.asarray(want))
'''


def test_layouts_and_devices_are_named():
    check_cases(LAYOUTS_AND_DEVICES_ARE_NAMED)


TORCH_CALLS_ON_TRACED_VALUES = COMMON + '''
@case
def torch_function_hints_tg_math():
    fn = lambda s, d, e: torch.sum(s.x)
    err = raises(tg.UnsupportedError, lambda: tg.propagate(g, fn, tg.sum(),
                                                           src={"x": np.ones((2, 3))}),
                 "torch.sum: torch functions cannot run on a traced value")
    assert "tg.math.sum" in err.hint
    raises(tg.UnsupportedError,
           lambda: tg.propagate(g, lambda s, d, e: torch.cat([s.x, s.x]), tg.sum(),
                                src={"x": np.ones((2, 3))}), "torch.cat")

@case
def torch_operands_on_the_left_still_work():
    w = torch.tensor(2.5, dtype=torch.float64)
    x = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = tg.propagate(g, lambda s, d, e: w * s.x - w, tg.sum(), src={"x": x})
    same(y.detach().numpy(), np.array([2.5 * 5 - 5.0, 2.5 * 3 - 2.5, 0.0]))
    y.sum().backward()
    same(x.grad.numpy(), np.array([2.5, 5.0]))

@case
def caller_tensor_untouched_by_radius():
    pos = torch.tensor([[0.0, 0.0], [0.5, 0.0], [3.0, 0.0]], dtype=torch.float64)
    graph = tg.Graph.radius(pos, 1.0)
    pos[2, 0] = 0.1        # writable, and the relation keeps what it was built from
    rp, ci = graph.resolve_csr()
    assert rp.tolist() == [0, 1, 2, 2] and ci.tolist() == [1, 0], (rp, ci)
'''


def test_torch_calls_on_traced_values():
    check_cases(TORCH_CALLS_ON_TRACED_VALUES)
