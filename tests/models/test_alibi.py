"""ALiBi: the slopes against transformers' own functions, their buffer through loading, the MPT
options refused, and BLOOM checkpoints as the hub ships them (no "transformer." prefix)."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from pagedgen import LLM, SamplingParams
from pagedgen.core.kv_geometry import KVGeometry
from pagedgen.layers.alibi import bloom_alibi_slopes, falcon_alibi_slopes, mpt_alibi_slopes
from tests.models.model_configs import COMMON
from tests.models.model_configs.alibi import CONFIGS
from tests.models.test_learned_positions import tiny_checkpoint
from tests.models.test_models import PROMPTS, reference_greedy

HEAD_COUNTS = [1, 2, 5, 12, 16, 32, 40, 71, 112]


@pytest.mark.parametrize("num_heads", HEAD_COUNTS)
def test_bloom_slopes_are_transformers(num_heads):
    # transformers' bias for a key at position 1 (no padding) is the slope itself
    alibi = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)
    slopes = bloom_alibi_slopes(num_heads)
    assert slopes.dtype == torch.float32 and slopes.shape == (num_heads,)
    assert torch.equal(slopes, alibi[:, 0, 1])


@pytest.mark.parametrize("num_heads", HEAD_COUNTS)
def test_falcon_slopes_are_transformers(num_heads):
    alibi = falcon_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]  # bf16'd
    torch.testing.assert_close(falcon_alibi_slopes(num_heads, 64), alibi / 8, rtol=0, atol=0)


@pytest.mark.parametrize("num_heads", HEAD_COUNTS)
@pytest.mark.parametrize("alibi_bias_max", [8, 12])
def test_mpt_slopes_are_transformers(num_heads, alibi_bias_max):
    # transformers' bias for the key one before the last is minus the slope
    alibi = build_mpt_alibi_tensor(num_heads, 2, alibi_bias_max)
    slopes = mpt_alibi_slopes(num_heads, alibi_bias_max)
    assert slopes.dtype == torch.float32 and slopes.shape == (num_heads,)
    assert torch.equal(slopes, -alibi[:, 0, 0])


@pytest.mark.parametrize(
    "name, num_kv_heads, head_dim",
    [("bloom", 6, 16), ("mpt", 6, 16), ("falcon-rw", 6, 16), ("falcon-alibi-multi-query", 1, 8)]
    + [("falcon-alibi-new-architecture", 2, 16)],
)
def test_the_cache_holds_the_checkpoints_kv_heads(name, num_kv_heads, head_dim):
    """BLOOM's and MPT's configs name their heads n_head and n_heads, MPT's width d_model."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    geometry = KVGeometry.of(config, torch.float32)
    assert (geometry.num_kv_heads, geometry.head_dim) == (num_kv_heads, head_dim)


@pytest.mark.parametrize("name", ["bloom", "mpt", "falcon-rw"])
def test_slopes_stay_float32_in_a_bfloat16_model(tmp_path, name):
    tiny_checkpoint(tmp_path, name)
    llm = LLM(str(tmp_path), dtype="bfloat16", kv_cache_memory=0.01, log=lambda m: None)
    model = llm.engine.runner.model
    for attention in model.attention_layers:
        assert not attention.use_rope
        assert attention.attn.spec.alibi_slopes.dtype == torch.float32
        assert "alibi_slopes" not in model.state_dict()  # not persistent: no checkpoint name
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "attn_config, match",
    [
        (dict(alibi=False), "without alibi"),
        (dict(attn_type="multiquery_attention"), "multiquery"),
        (dict(prefix_lm=True), "prefix_lm"),
        (dict(qk_ln=True), "qk_ln"),
        (dict(alibi_bias_max=16), "alibi_bias_max"),
    ],
)
def test_mpt_refuses_what_it_does_not_compute(tmp_path, attn_config, match):
    tiny_checkpoint(tmp_path, "mpt")
    config = AutoConfig.from_pretrained(tmp_path)
    for key, value in attn_config.items():
        setattr(config.attn_config, key, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path), kv_cache_memory=0.01, log=lambda m: None)


@pytest.mark.parametrize(
    "overrides, match",
    [(dict(no_bias=False), "no_bias"), (dict(logit_scale=0.5), "logit_scale")],
)
def test_mpt_refuses_options_transformers_ignores(tmp_path, overrides, match):
    tiny_checkpoint(tmp_path, "mpt")
    config = AutoConfig.from_pretrained(tmp_path)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path), kv_cache_memory=0.01, log=lambda m: None)


def test_bloom_hub_checkpoint_names(tmp_path):
    """bloom-560m's tensors: "word_embeddings.weight", "h.0....", no "transformer."."""
    model = tiny_checkpoint(tmp_path, "bloom")
    path = tmp_path / "model.safetensors"
    weights = {name.removeprefix("transformer."): t for name, t in load_file(path).items()}
    assert "word_embeddings_layernorm.bias" in weights and "lm_head.weight" not in weights
    save_file(weights, path, metadata={"format": "pt"})
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=lambda m: None)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params)):
        assert output.outputs[0].token_ids == reference_greedy(model, prompt, 16)
