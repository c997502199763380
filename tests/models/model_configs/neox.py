"""Tiny configurations of GPT-NeoX (Pythia), GPT-J, Falcon and StarCoder2 (models/test_models.py).

GPT-NeoX, GPT-J and Falcon configs name no num_key_value_heads (the engine then caches every
head); None here undoes COMMON's 2 as a hub checkpoint's config.json would."""

CONFIGS: dict[str, dict] = {
    "gpt_neox": dict(  # Pythia: parallel residual, a quarter of each head rotates
        model_type="gpt_neox", num_key_value_heads=None, rotary_pct=0.25, rotary_emb_base=10000
    ),
    "gpt_neox-sequential": dict(  # attention, then the MLP; q/k/v and dense unbiased
        model_type="gpt_neox",
        num_key_value_heads=None,
        rotary_pct=0.25,
        use_parallel_residual=False,
        attention_bias=False,
        tie_word_embeddings=False,
    ),
    "gptj": dict(  # 8 of each head's 16 features rotate, in interleaved pairs
        model_type="gptj", num_key_value_heads=None, n_inner=128, rotary_dim=8
    ),
    "falcon-7b": dict(  # multi-query (one K/V head), one parallel norm
        model_type="falcon",
        num_key_value_heads=None,
        multi_query=True,
        parallel_attn=True,
        ffn_hidden_size=128,
    ),
    "falcon-40b": dict(  # two K/V groups, ln_attn and ln_mlp
        model_type="falcon",
        new_decoder_architecture=True,
        num_kv_heads=2,
        ffn_hidden_size=128,
    ),
    "falcon-11b": dict(  # the new architecture with one norm, two K/V groups
        model_type="falcon",
        num_key_value_heads=None,
        new_decoder_architecture=True,
        num_ln_in_parallel_attn=1,
        num_kv_heads=2,
        ffn_hidden_size=128,
        tie_word_embeddings=False,
    ),
    "falcon-sequential": dict(  # attention then the MLP, every head its K/V, biased
        model_type="falcon",
        num_key_value_heads=None,
        multi_query=False,
        parallel_attn=False,
        bias=True,
        ffn_hidden_size=128,
    ),
    "starcoder2": dict(  # a window shorter than the long prompts, long enough to preempt
        model_type="starcoder2", sliding_window=16, pad_token_id=0
    ),
}
