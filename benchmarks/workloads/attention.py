"""Causal self-attention as message passing (online-softmax reducer over Graph.triangular)
against torch's fused SDPA and a naive torch version; forward, and forward + backward."""
from __future__ import annotations

import numpy as np

from . import Peer, Workload
from . import _common as C

HEADS, WIDTH = 16, 64
SIZES = (1024, 4096)
TEXT = (f"Causal self-attention, {HEADS} heads of width {WIDTH}, float32, sequence length N; "
        "inputs head-major (H, N, D) viewed as (N, H, D). `step`: gradients of <out, c> "
        "w.r.t. q, k, v for a fixed random cotangent c (torch autograd in every peer).")


def setup(n: int) -> dict:
    rng = np.random.default_rng(C.SEED)
    q, k, v, c = (rng.standard_normal((HEADS, n, WIDTH), dtype=np.float32) for _ in range(4))
    return {"n": n, "q": q, "k": k, "v": v, "c": c}


def expected(grad: bool):
    def oracle(d: dict, i: int) -> list:
        """float64, one head at a time (N x N scores per head only), gradients by hand:
        dv = P^T c, dP = c v^T, dS = P (dP - rowsum(dP P)), dq = dS k s, dk = dS^T q s."""
        n, s = d["n"], WIDTH ** -0.5
        future = np.triu(np.ones((n, n), dtype=bool), 1)
        outs = [np.empty((n, HEADS, WIDTH)) for _ in range(3 if grad else 1)]
        for h in range(HEADS):
            q, k, v, c = (d[key][h].astype(np.float64) for key in "qkvc")
            sc = np.where(future, -np.inf, (q @ k.T) * s)
            p = np.exp(sc - sc.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            if not grad:
                outs[0][:, h] = p @ v
                continue
            dp = c @ v.T
            ds = p * (dp - (dp * p).sum(1, keepdims=True))
            outs[0][:, h], outs[1][:, h], outs[2][:, h] = ds @ k * s, ds.T @ q * s, p.T @ c
        return outs
    return oracle


def _peer(forward_of, grad: bool):
    def factory(d: dict, threads: int):
        torch = C.torch_threads(threads)
        q, k, v = (torch.from_numpy(d[key]).permute(1, 0, 2).requires_grad_(grad)
                   for key in "qkv")
        c = torch.from_numpy(d["c"]).permute(1, 0, 2)
        forward = forward_of(torch, d["n"])

        def call(i):
            if grad:
                return torch.autograd.grad(forward(q, k, v), (q, k, v), c)
            with torch.no_grad():
                return forward(q, k, v)
        return call
    return factory


def _sdpa(torch, n):
    def forward(q, k, v):
        # (1, H, N, D): torch's CPU flash kernel needs the batch axis (3-D inputs take the
        # math path, several times slower and O(N^2) memory)
        qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        return out[0].transpose(0, 1)
    return forward


def _naive(torch, n):
    future = torch.ones(n, n, dtype=torch.bool).triu(1)

    def forward(q, k, v):
        qh, kh, vh = (t.transpose(0, 1) for t in (q, k, v))
        s = (qh @ kh.transpose(-1, -2)) * WIDTH ** -0.5
        return (s.masked_fill(future, -torch.inf).softmax(-1) @ vh).transpose(0, 1)
    return forward


def _tiga(torch, n):
    import tiga as tg

    class CausalAttention(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge, scale):
            return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)

    graph, program = tg.Graph.triangular(n), CausalAttention()
    return lambda q, k, v: program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                                   scale=WIDTH ** -0.5)


def _peers(grad: bool) -> dict:
    return {"sdpa": Peer(_peer(_sdpa, grad), ("torch",),
                         note="F.scaled_dot_product_attention(is_causal=True), (1, H, N, D)"),
            "naive torch": Peer(_peer(_naive, grad), ("torch",),
                                note="scores, masked_fill, softmax, @ v (N x N per head)"),
            "tiga": Peer(_peer(_tiga, grad), ("torch",), tiga=True,
                         note="online_softmax over Graph.triangular, torch bridge")}


WORKLOADS = [
    Workload("attention.fwd", "Causal attention, forward", TEXT, SIZES, setup, expected(False),
             _peers(False)),
    Workload("attention.step", "Causal attention, forward + backward", TEXT, SIZES, setup,
             expected(True), _peers(True), tol_scale=10.0),
]
