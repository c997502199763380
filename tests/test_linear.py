import pytest
import torch

from pagedgen.layers.linear import Linear, onednn_linear_available, pack_linear_weights

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="no oneDNN linear here")


def make_linear(bias: bool, dtype: torch.dtype = torch.float32) -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(0)
    layer = Linear(48, [32, 16], bias=bias).to(dtype)
    full = torch.randn(48, 48)
    layer.load_shard("weight", full[:32].to(dtype), 0)
    layer.load_shard("weight", full[32:].to(dtype), 1)
    if bias:
        layer.load_shard("bias", torch.arange(32.0).to(dtype), 0)
        layer.load_shard("bias", -torch.arange(16.0).to(dtype), 1)
    return layer, full


@pytest.mark.parametrize("bias", [False, True])
def test_shards_land_in_their_columns(bias):
    layer, full = make_linear(bias)
    x = torch.randn(5, 48)
    expected = x @ full.T
    if bias:
        expected += torch.cat([torch.arange(32.0), -torch.arange(16.0)])
    torch.testing.assert_close(layer(x), expected)


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_dense_and_rows_do_not_depend_on_the_batch(bias):
    layer, _ = make_linear(bias)
    x = torch.randn(70, 48)
    dense = layer(x)
    assert pack_linear_weights(layer) == 1 and layer.packed
    packed = layer(x)
    torch.testing.assert_close(packed, dense, atol=1e-5, rtol=1e-5)
    for rows in (1, 3, 64):
        assert torch.equal(layer(x[:rows]), packed[:rows])
    with pytest.raises(AssertionError):
        layer.load_shard("weight", torch.zeros(32, 48))


def test_float16_and_unavailable_stay_dense(monkeypatch):
    layer, _ = make_linear(False, torch.float16)
    assert not layer.pack() and not layer.packed
    monkeypatch.setattr("pagedgen.layers.linear.onednn_linear_available", lambda: False)
    layer, _ = make_linear(False)
    assert not layer.pack() and not layer.packed
