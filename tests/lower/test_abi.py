"""lower/abi: the one kernel ABI both renderers emit. The same propagate rendered for cpu-llvm
and for triton has one signature type whose operand part (walk, slots, roles, row shapes and
dtypes) is what the inputs say it must be; signatures survive the disk caches' JSON and a
stored one of another ABI is refused; every relation descriptor a target is given names a
walk that target's renderer has."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tiga as tg
from tiga.lower import abi
from tiga.lower.backends import BACKENDS
from tiga.lower.ir import LaunchOp
from tiga.lower.llvm.walks import walk_for
from tiga.lower.pipeline import lower
from tiga.lower.triton.walks import walk_slots
from tiga.trace.message_passing import PropagateCall

SRC = np.array([0, 2, 1, 3, 3, 0, 4])
DST = np.array([1, 0, 0, 2, 1, 2, 2])


def _inputs(dtype):
    rng = np.random.default_rng(0)
    graph = tg.Graph.from_coo(SRC, DST, num_src=5, num_dst=3)
    x = rng.standard_normal((5, 2, 3)).astype(dtype)
    h = rng.standard_normal((3, 2, 3)).astype(dtype)
    w = rng.standard_normal(len(SRC)).astype(dtype)
    return graph, x, h, w


def _launch(target: str, reduce_by: str, dtype) -> LaunchOp:
    graph, x, h, w = _inputs(dtype)
    call = PropagateCall(graph, lambda s, d, e: tg.math.tanh(s.x + d.h) * e.w, tg.sum(),
                         {"x": x}, {"h": h}, {"w": w}, None, {}, reduce_by=reduce_by)
    program, _ = call.staged_program()
    module = lower(program, until="kernel", target=target)
    [op] = [op for op in module.body.ops if isinstance(op, LaunchOp)]
    return op


def _expected_operands(reduce_by: str, dtype) -> dict:
    """The operand part the inputs dictate: fields in role order (src x, dst h, edge w), one
    output of x's row shape (whole for reduce_by="all")."""
    _, x, h, w = _inputs(dtype)
    walk = "src" if reduce_by == "src" else "dst"
    # the CSR's arrays; by source the transposed CSR reaches user edge ids through edge_perm
    walk_arrays = ("row_ptr", "col_idx") + (("edge_perm",) if walk == "src" else ())
    name = np.dtype(dtype).name
    return dict(walk=walk, reduce_by=reduce_by,
                slots=walk_arrays + ("field:0", "field:1", "field:2", "out:0"),
                roles=("src", "dst", "edge"),
                field_shapes=(x.shape[1:], h.shape[1:], w.shape[1:]),
                field_dtypes=(name,) * 3, out_shapes=(x.shape[1:],), out_dtypes=(name,),
                relation=("csr",))


@pytest.mark.parametrize("reduce_by", ["dst", "src", "edge", "all"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_both_renderers_emit_one_abi(reduce_by, dtype):
    want = _expected_operands(reduce_by, dtype)
    for target in abi.TARGETS:
        source = BACKENDS[target].render(_launch(target, reduce_by, dtype), f"k_{target[:3]}")
        assert type(source) is abi.KernelSource and type(source.signature) is abi.KernelSignature
        sig = source.signature
        assert sig.target == target == BACKENDS[target].target
        assert sig.symbol == f"k_{target[:3]}" and sig.symbol in source.text
        got = {k: getattr(sig, k) for k in want}
        assert got == want, (target, got)


@pytest.mark.parametrize("target", abi.TARGETS)
def test_signature_round_trips_through_json(target):
    for reduce_by in ("dst", "src", "edge", "all"):
        sig = BACKENDS[target].render(_launch(target, reduce_by, np.float32), "k").signature
        text = sig.to_json()
        assert json.loads(text)["abi"] == abi.ABI_VERSION
        assert abi.KernelSignature.from_json(text) == sig
        assert abi.KernelSignature.from_dict(json.loads(text)) == sig
    # nested descriptors (a stencil's shape and offsets) come back as the same tuples
    sig = abi.KernelSignature(target="cpu-llvm", symbol="k", walk="dst", reduce_by="dst",
                              slots=(), roles=(), field_shapes=((2, 3),), field_dtypes=("f",),
                              out_shapes=((),), out_dtypes=("f",), index_dtype="int64",
                              relation=("stencil", (3, 4), ((0, 1), (-1, 0)), False),
                              split_states=((8, "float32"),))
    assert abi.KernelSignature.from_json(sig.to_json()) == sig


@pytest.mark.parametrize("corrupt, why", [
    (lambda d: d.update(abi=abi.ABI_VERSION + 1), "ABI version"),
    (lambda d: d.pop("abi"), "ABI version None"),
    (lambda d: d.pop("roles"), "do not match"),
    (lambda d: d.update(launch_grid=[1]), "do not match"),
    (lambda d: d.update(target="cuda-c"), "'cuda-c'"),
])
def test_a_stored_signature_of_another_abi_is_refused(corrupt, why):
    sig = BACKENDS["cpu-llvm"].render(_launch("cpu-llvm", "dst", np.float64), "k").signature
    data = json.loads(sig.to_json())
    corrupt(data)
    with pytest.raises(ValueError, match=why):
        abi.KernelSignature.from_dict(data)


def _relations():
    rng = np.random.default_rng(3)
    pts = rng.random((30, 2))
    return {
        "csr": tg.Graph.from_coo(SRC, DST, num_src=5, num_dst=3),
        "sparse_sources": tg.Graph.from_coo(np.array([7, 400_000]), np.array([0, 1]),
                                            num_src=500_000, num_dst=2),
        "dense": tg.Graph.dense(3, 4),
        "triangular": tg.Graph.triangular(5),
        "cu_seqlens": tg.Graph.cu_seqlens([0, 2, 2, 5], causal=True),
        "stencil": tg.Graph.stencil((3, 4), [(0, 1), (1, -1)], periodic=False),
        "stencil_no_offsets": tg.Graph.stencil((3, 4), []),
        "radius": tg.Graph.radius(pts, 0.2),
        "radius_query": tg.Graph.radius(pts, 0.2, query=pts[:7]),
        "knn": tg.Graph.knn(pts, 3),
    }


@pytest.mark.parametrize("walk", ["dst", "src"])
def test_descriptors_name_a_walk_of_their_target(walk):
    """Each target's descriptor is one its renderer walks (an unknown kind raises there);
    the implicit kinds keep their own walk on both targets, the radius cell walk is
    triton's, a stored relation with sparse sources walks csr_rows by source."""
    for name, g in _relations().items():
        llvm = abi.relation_descriptor(g, walk, target="cpu-llvm")
        triton = abi.relation_descriptor(g, walk, target="triton")
        walk_for(llvm)   # (the cpu-llvm renderer's walk table raises on a kind it lacks)
        assert triton[0] in abi.NATIVE_WALKS["triton"] and isinstance(walk_slots(triton), tuple)
        suffix = "_t" if walk == "src" else ""
        if g.kind in abi.IMPLICIT_KINDS and name != "stencil_no_offsets":
            assert llvm == triton and llvm[0] == g.kind + suffix, (name, llvm)
        elif name == "sparse_sources":
            assert llvm == triton == (("csr_rows",) if walk == "src" else ("csr",))
        elif name == "radius" or (name == "radius_query" and walk == "dst"):
            assert llvm == ("csr",) and triton == ("radius", 2), (name, triton)
        elif name == "stencil_no_offsets":   # (triton's offsets array would be empty)
            assert llvm[0] == "stencil" + suffix and triton == ("csr",)
        else:
            assert llvm == triton == ("csr",), (name, llvm, triton)


def test_descriptor_names_its_target():
    with pytest.raises(ValueError, match="target is 'cuda'"):
        abi.relation_descriptor(tg.Graph.triangular(3), "dst", target="cuda")
