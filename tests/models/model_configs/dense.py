"""Tiny configurations of the Llama-family dense decoders (tests/models/test_models.py)."""

GRANITE = dict(  # Granite 3's multipliers, of its 2B model
    pad_token_id=0,
    embedding_multiplier=12.0,
    attention_multiplier=0.015625,
    residual_multiplier=0.22,
    logits_scaling=8.0,
)

CONFIGS = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama3-rope-tied": dict(
        model_type="llama",
        tie_word_embeddings=True,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False),
    "seed-oss": dict(  # q/k/v biased, o not
        model_type="seed_oss", attention_bias=True, attention_out_bias=False, pad_token_id=0
    ),
    "phi3": dict(model_type="phi3", pad_token_id=0, sliding_window=None),
    "olmo2": dict(model_type="olmo2", pad_token_id=0),
    "olmo3": dict(  # three windowed layers of four, a rope base per kind of layer
        model_type="olmo3",
        num_hidden_layers=4,
        sliding_window=8,
        pad_token_id=0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        },
    ),
    "exaone4": dict(  # post-sublayer norms, per-head q/k norms, 3 windowed layers, 1 NoPE one
        model_type="exaone4",
        num_hidden_layers=4,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        pad_token_id=0,
    ),
    "glm": dict(  # half of each head rotates, in interleaved pairs; gate/up one tensor
        model_type="glm",
        head_dim=32,
        partial_rotary_factor=0.5,
        attention_bias=True,
        pad_token_id=0,
    ),
    "glm4": dict(  # and each sublayer's output normed again
        model_type="glm4",
        head_dim=32,
        partial_rotary_factor=0.5,
        attention_bias=True,
        pad_token_id=0,
    ),
    "ernie4_5": dict(  # interleaved rotary pairs over the whole head, every projection biased
        model_type="ernie4_5", use_bias=True, tie_word_embeddings=True, pad_token_id=0
    ),
    "granite": dict(model_type="granite", tie_word_embeddings=True, **GRANITE),
    "smollm3": dict(
        model_type="smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0
    ),
    "phi3-longrope": dict(  # Phi-3's 128k models: the short factors up to 128 tokens
        model_type="phi3",
        pad_token_id=0,
        sliding_window=None,
        original_max_position_embeddings=128,
        rope_scaling=dict(
            type="longrope",
            short_factor=[1.0, 1.1, 1.3, 1.0, 2.0, 1.0, 1.5, 1.2],
            long_factor=[4.0] * 8,
        ),  # fmt: skip
    ),
    "phi3-partial-rotary": dict(  # Phi-4-mini's shape: a quarter of each head does not rotate
        model_type="phi3", pad_token_id=0, partial_rotary_factor=0.75, tie_word_embeddings=True
    ),
}
