import argparse
import os

import torch

import tiga as tg


class CausalAttention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        score = (dst.query * src.key).sum(dim=-1) * scale
        return self.reducer(score, src.value)


def torch_attention(query, key, value, causal=True):
    # Public shape (N, H, D); matrix multiplication uses (H, N, D).
    q, k, v = (x.transpose(0, 1) for x in (query, key, value))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1]**-0.5
    if causal:
        future = torch.ones(q.shape[1], q.shape[1], device=q.device,
                            dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, -torch.inf)
    weights = scores.softmax(-1)
    return (weights @ v).transpose(0, 1)


def main(nodes=65, dense=False, device="cpu"):
    torch.manual_seed(7)
    heads, width = 2, 64
    dtype = torch.float16 if device == "cuda" else torch.float32
    # Head-major storage, viewed as ordinary (N, H, D) Torch tensors.
    query, key, value = (
        torch.randn(heads, nodes, width, device=device, dtype=dtype)
        .permute(1, 0, 2) for _ in range(3))
    graph = tg.Graph.dense(nodes) if dense else tg.Graph.triangular(nodes, device=device)
    program = CausalAttention()
    with torch.no_grad():
        output = program(graph=graph, src={"key": key, "value": value},
                         dst={"query": query}, scale=width**-0.5)

    # The compiled streaming path (not the reference interpreter) ran the forward.
    report = program.explain(graph=graph, src={"key": key, "value": value},
                             dst={"query": query}, scale=width**-0.5)
    assert report.route != "reference", str(report)
    assert any(why == "tiled streaming attention" for _, _, why in report.routes), str(report)
    expected = torch_attention(query.float(), key.float(), value.float(), causal=not dense)
    torch.testing.assert_close(output.float(), expected, rtol=2e-4, atol=2e-5)

    # Query/key/value gradients: the compiled FlashAttention-2-style backward (torch
    # autograd through Tiga's VJP program) against torch autograd on the explicit oracle,
    # with an independent random cotangent rather than a summed-output loss.
    variables = tuple(x.float().detach().requires_grad_()
                      for x in (query, key, value))
    q, k, v = variables
    compiled = program(graph=graph, src={"key": k, "value": v},
                       dst={"query": q}, scale=width**-0.5)
    semantic = program.reference(
        graph=graph, src={"key": k, "value": v},
        dst={"query": q}, scale=width**-0.5)
    reference_variables = tuple(x.detach().clone().requires_grad_()
                                for x in variables)
    reference = torch_attention(*reference_variables, causal=not dense)
    cotangent = torch.randn_like(reference)
    gradients = torch.autograd.grad(compiled, variables, cotangent)
    semantic_gradients = torch.autograd.grad(semantic, variables, cotangent)
    expected_gradients = torch.autograd.grad(
        reference, reference_variables, cotangent)
    torch.testing.assert_close(compiled, reference, rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(semantic, reference, rtol=2e-4, atol=2e-5)
    for actual, sem, expected in zip(gradients, semantic_gradients, expected_gradients):
        torch.testing.assert_close(actual, expected, rtol=3e-4, atol=3e-5)
        torch.testing.assert_close(sem, expected, rtol=3e-4, atol=3e-5)
    relation = "dense" if dense else "causal"
    if os.environ.get("TIGA_DEMO_VERBOSE") == "1":
        print(report)
    print(f"{relation} attention, N={nodes}, {heads} heads x {width}: forward and q/k/v "
          f"gradients match torch ({report.route})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=65)
    parser.add_argument("--dense", action="store_true",
                        help="unmasked attention over tg.Graph.dense(N)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    main(args.nodes, args.dense, args.device)
