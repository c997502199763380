"""Tiny configurations of GPT-2, GPT-BigCode (StarCoder) and OPT: learned absolute positions.

COMMON's num_key_value_heads is overridden: these configs name no kv heads of their own (GPT-2,
OPT) or derive them from multi_query (GPT-BigCode), and KVGeometry reads the key."""

CONFIGS: dict[str, dict] = {
    "gpt2": dict(model_type="gpt2", num_key_value_heads=None, n_inner=128),
    "gpt2-inverse-layer-idx": dict(  # layer i's scores / (i + 1); a 4 x hidden MLP, own LM head
        model_type="gpt2",
        num_key_value_heads=None,
        num_hidden_layers=3,
        scale_attn_by_inverse_layer_idx=True,
        reorder_and_upcast_attn=True,
        tie_word_embeddings=False,
    ),
    "gpt-bigcode-multi-query": dict(  # one kv head
        model_type="gpt_bigcode", num_key_value_heads=1, multi_query=True, n_inner=128
    ),
    "gpt-bigcode-multi-head": dict(  # c_attn's rows q, k, v per head
        model_type="gpt_bigcode", num_key_value_heads=4, multi_query=False, n_inner=128
    ),
    "opt": dict(model_type="opt", num_key_value_heads=None, ffn_dim=128),
    "opt-350m": dict(  # post-norm, no final norm; 32-wide embeddings projected in and out
        model_type="opt",
        num_key_value_heads=None,
        ffn_dim=128,
        do_layer_norm_before=False,
        word_embed_proj_dim=32,
    ),
    "opt-no-final-norm": dict(  # pre-norm without the decoder's final LayerNorm, unbiased
        model_type="opt",
        num_key_value_heads=None,
        ffn_dim=128,
        _remove_final_layer_norm=True,
        enable_bias=False,
    ),
}
