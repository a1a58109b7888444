"""tg.nn.aggr exports what PyG's torch_geometric.nn.aggr does, DegreeScalerAggregation
included: the very class PNAConv reduces with, importable as PyG users write it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402


def test_degree_scaler_aggregation_is_the_class_pnaconv_uses():
    from tiga.nn.aggr import DegreeScalerAggregation

    assert "DegreeScalerAggregation" in tg.nn.aggr.__all__
    assert "DegreeScalerAggregation" in dir(tg.nn.aggr)
    assert tg.nn.DegreeScalerAggregation is DegreeScalerAggregation
    conv = tg.nn.PNAConv(4, 6, ["mean", "max"], ["identity", "amplification"],
                         deg=torch.tensor([0, 3, 2, 1]))
    assert type(conv.aggr_module) is DegreeScalerAggregation
    assert isinstance(conv.aggr_module, tg.nn.aggr.Aggregation)


def test_degree_scaler_aggregation_alone_scales_by_in_degree():
    from tiga.nn.aggr import DegreeScalerAggregation

    aggr = DegreeScalerAggregation("sum", ["identity", "linear"], deg=torch.tensor([0, 2]))
    # groups 0 (three rows) and 1 (one row); mean degree of the histogram: 1
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    out = aggr(x, torch.tensor([0, 0, 0, 1]), dim_size=2)
    assert out.shape == (2, 2)
    torch.testing.assert_close(out, torch.tensor([[6.0, 18.0], [4.0, 4.0]]))


def test_every_aggregation_name_resolves():
    for name in tg.nn.aggr.__all__:
        assert getattr(tg.nn.aggr, name) is not None, name
    with pytest.raises(AttributeError):
        tg.nn.aggr.NoSuchAggregation  # noqa: B018
