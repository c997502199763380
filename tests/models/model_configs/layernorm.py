"""Tiny configurations of Phi, StableLM, Nemotron and Arcee (tests/models/test_models.py)."""

CONFIGS: dict[str, dict] = {
    "phi": dict(  # phi-2's rotary fraction: 6 of each head's 16 features rotate
        model_type="phi", partial_rotary_factor=0.4, tie_word_embeddings=False
    ),
    "phi-qk-layernorm": dict(  # and the lm_head's weight tied, its bias not
        model_type="phi", qk_layernorm=True, hidden_act="gelu", tie_word_embeddings=True
    ),
    "stablelm": dict(model_type="stablelm"),  # StableLM-3B-4E1T: a quarter of each head rotates
    "stablelm2-12b": dict(  # per-head q/k norms, q/k/v biased, the parallel block
        model_type="stablelm",
        use_qkv_bias=True,
        qk_layernorm=True,
        use_parallel_residual=True,
        tie_word_embeddings=True,
    ),
    "nemotron": dict(model_type="nemotron"),  # half of each head rotates
    "nemotron-bias": dict(  # every projection biased, the whole head rotating, head_dim its own
        model_type="nemotron",
        head_dim=32,
        partial_rotary_factor=1.0,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
    ),
    "arcee": dict(  # AFM-4.5B's YaRN scaling
        model_type="arcee",
        rope_scaling=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=64, rope_theta=10000.0
        ),
    ),
}
