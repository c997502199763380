"""Tiny configurations of Granite 4.0's architecture (granitemoehybrid), attention layers only
(tests/models/test_models.py)."""

from tests.models.model_configs.dense import GRANITE

ATTENTION_ONLY = dict(model_type="granitemoehybrid", layer_types=["attention"] * 2)

CONFIGS: dict[str, dict] = {
    "granite4-dense-rope": dict(  # granite-4.0-micro: no experts, the shared MLP is the MLP
        **ATTENTION_ONLY,
        num_local_experts=0,
        shared_intermediate_size=96,
        position_embedding_type="rope",
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        tie_word_embeddings=True,
        **GRANITE,
    ),
    "granite4-dense-nope": dict(  # no positional encoding at all, biased attention, untied
        **ATTENTION_ONLY,
        num_local_experts=0,
        shared_intermediate_size=80,
        position_embedding_type="nope",
        attention_bias=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        embedding_multiplier=3.0,
        attention_multiplier=0.05,
        residual_multiplier=0.5,
        logits_scaling=2.5,
    ),
    "granite4-moe-shared": dict(  # top-2 of 4 experts plus the shared MLP, rotary
        **ATTENTION_ONLY,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=96,
        position_embedding_type="rope",
        **GRANITE,
    ),
}
