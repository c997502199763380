"""Tiny random-weight configurations of every architecture, by name: tests/models/test_models.py
checks each one's greedy tokens and logprobs against transformers."""

from tests.models.model_configs import (
    alibi,
    dense,
    early_decoders,
    gemma_cohere,
    granite_hybrid,
    layernorm,
    learned_positions,
    llama_variants,
    moe,
    moe_variants,
    neox,
)

COMMON = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.3,
    eos_token_id=256,
    bos_token_id=256,
)

CONFIGS = (
    dense.CONFIGS
    | moe.CONFIGS
    | gemma_cohere.CONFIGS
    | layernorm.CONFIGS
    | learned_positions.CONFIGS
    | neox.CONFIGS
    | llama_variants.CONFIGS
    | moe_variants.CONFIGS
    | early_decoders.CONFIGS
    | alibi.CONFIGS
    | granite_hybrid.CONFIGS
)
