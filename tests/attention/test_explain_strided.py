"""explain() of attention called with torch's head-major views: the attention routes read
the strided inputs in place (the numpy tiles copy one tile at a time), so no whole-array
contiguous copy is reported; the K^T tiles the native forward kernel packs are."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


@pytest.mark.parametrize("dtype,native", [(torch.float32, True), (torch.float64, False)])
def test_head_major_views_are_not_reported_as_copied(dtype, native):
    n, heads, width = 97, 2, 64
    q, k, v = (torch.randn(heads, n, width, dtype=dtype).permute(1, 0, 2) for _ in range(3))
    call = dict(graph=tg.Graph.triangular(n), src={"key": k, "value": v}, dst={"query": q},
                scale=width ** -0.5)
    ex = Attention().explain(**call)
    copies = [m for m in ex.materialized if m[0].startswith("contiguous copy")]
    packed = [m for m in ex.materialized if m[0].startswith("K^T packed")]
    assert not copies, ex
    if native:
        assert packed and packed[0][1] == 4 * heads * 128 * width, ex   # 97 keys padded to 128
    else:
        assert not packed, ex
    out = Attention()(**call)
    s = torch.einsum("ihd,jhd->hij", q.double(), k.double()) * width ** -0.5
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    want = torch.einsum("hij,jhd->ihd", s.softmax(-1), v.double())
    tol = 2e-5 if native else 1e-10
    np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=tol, atol=tol)
