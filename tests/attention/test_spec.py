"""AttentionSpec: a layer's attention constants, checked and fixed when the layer is built."""

import pytest
import torch
from torch import nn
from transformers import Gemma2Config, LlamaConfig

from pagedgen.attention.spec import AttentionSpec
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.models.gemma2 import Gemma2ForCausalLM
from pagedgen.models.gpt_oss import GptOssAttention
from pagedgen.models.llama import LayerOptions


def test_the_spec_refuses_what_no_layer_has() -> None:
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        AttentionSpec(6, 4, 64, 0.125)
    with pytest.raises(ValueError, match="sliding_window"):
        AttentionSpec(4, 2, 64, 0.125, sliding_window=0)
    with pytest.raises(ValueError, match=r"sinks must have shape \(4,\)"):
        AttentionSpec(4, 2, 64, 0.125, sinks=torch.zeros(2))


def test_specs_compare_by_their_constants_not_their_tensors() -> None:
    spec = AttentionSpec(4, 2, 64, 0.125, 16, 50.0, torch.zeros(4), torch.ones(4))
    assert spec == AttentionSpec(4, 2, 64, 0.125, 16, 50.0)
    assert hash(spec) == hash(AttentionSpec(4, 2, 64, 0.125, 16, 50.0))
    assert spec != AttentionSpec(4, 2, 64, 0.125, 16, None)


def test_each_layer_is_built_with_its_constants() -> None:
    config = Gemma2Config(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=32,
        attn_logit_softcapping=50.0,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    model = Gemma2ForCausalLM(config, TorchAttentionBackend(), 64)
    specs = [attention.attn.spec for attention in model.attention_layers]
    assert specs == [
        AttentionSpec(4, 2, 16, 32**-0.5, 8, 50.0),
        AttentionSpec(4, 2, 16, 32**-0.5, None, 50.0),
    ]


def test_a_layers_sinks_and_slopes_are_its_own_tensors() -> None:
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)
    layer = LayerOptions(scale=1.0, alibi_slopes=slopes)
    attention = GptOssAttention(config, TorchAttentionBackend(), True, True, layer)
    spec = attention.attn.spec
    assert isinstance(attention.sinks, nn.Parameter) and spec.sinks is attention.sinks
    assert spec.scale == 1.0 and not attention.use_rope
    assert spec.alibi_slopes.dtype == torch.float32 and torch.equal(
        spec.alibi_slopes, slopes.float()
    )
