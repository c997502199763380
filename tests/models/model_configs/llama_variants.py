"""Tiny configurations of the Llama, Gemma and Granite variants (tests/models/test_models.py)."""

from tests.models.model_configs.dense import GRANITE

CONFIGS: dict[str, dict] = {
    "olmo1": dict(model_type="olmo", pad_token_id=0),
    "olmo1-clip-qkv-bias": dict(  # OLMo 1.7's clamped q/k/v, at a bound the values pass
        model_type="olmo", clip_qkv=1.0, attention_bias=True, pad_token_id=0
    ),
    "helium": dict(  # interleaved rotary pairs; q/k/v biased, o not
        model_type="helium", head_dim=16, attention_bias=True, mlp_bias=True, pad_token_id=0
    ),
    "ministral": dict(
        model_type="ministral",
        head_dim=16,  # the reference fails on the config's None
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=0,
    ),
    "ministral3": dict(  # queries scaled from position 16 on, more from 48
        model_type="ministral3",
        head_dim=16,
        pad_token_id=0,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=16.0,
            original_max_position_embeddings=16,
            max_position_embeddings=256,
            beta_fast=32.0,
            beta_slow=1.0,
            mscale_all_dim=1.0,
            mscale=1.0,
            llama_4_scaling_beta=0.3,
        ),
    ),
    "granite_swa": dict(  # a NoPE full layer, three windowed ones on two rope bases
        model_type="granite_swa",
        num_hidden_layers=4,
        sliding_window=8,
        layer_rope_theta=[0, 10000.0, 10000.0, 500000.0],
        **GRANITE,
    ),
    "vaultgemma": dict(
        model_type="vaultgemma",
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        pad_token_id=0,
    ),
    "cwm": dict(
        model_type="cwm",
        num_hidden_layers=4,
        head_dim=16,
        sliding_window=8,
        pad_token_id=0,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=1000000.0,
            factor=16.0,
            high_freq_factor=16.0,
            low_freq_factor=1.0,
            original_max_position_embeddings=64,
        ),
    ),
    "hyperclovax": dict(model_type="hyperclovax", **GRANITE),
    "hyperclovax-no-post-norm": dict(
        model_type="hyperclovax", use_post_norm=False, tie_word_embeddings=True, **GRANITE
    ),
    "nanochat": dict(model_type="nanochat", pad_token_id=0),
}
