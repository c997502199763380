"""Tiny configurations of GPT-Neo, CodeGen, Persimmon, Apertus and HunYuan.

GPT-Neo, CodeGen and Persimmon configs name no num_key_value_heads (every head has its K/V);
None undoes COMMON's 2 as a hub checkpoint's config.json would."""

CONFIGS: dict[str, dict] = {
    "gpt-neo": dict(  # a global then a local layer, its window shorter than the long prompts
        model_type="gpt_neo",
        num_key_value_heads=None,
        attention_types=[[["global", "local"], 1]],
        window_size=8,
        tie_word_embeddings=True,
    ),
    "gpt-neo-local-untied": dict(  # local layers first, a window of one token; own LM head
        model_type="gpt_neo",
        num_key_value_heads=None,
        num_hidden_layers=3,
        attention_types=[[["local"], 2], [["global"], 1]],
        window_size=1,
        intermediate_size=None,
        tie_word_embeddings=False,
    ),
    "codegen": dict(  # 4 shards of q/v/k; 8 of each head's 16 features rotate, interleaved
        model_type="codegen", num_key_value_heads=None, n_inner=128, rotary_dim=8
    ),
    "persimmon": dict(  # per-head q/k LayerNorms; half of each head rotates; relu2
        model_type="persimmon", num_key_value_heads=None, pad_token_id=0
    ),
    "persimmon-no-qk-norm": dict(
        model_type="persimmon",
        num_key_value_heads=None,
        qk_layernorm=False,
        tie_word_embeddings=True,
        pad_token_id=0,
    ),
    "apertus": dict(  # xIELU with learned scalars; q/k norms; llama3-scaled rope; GQA
        model_type="apertus", pad_token_id=0
    ),
    "apertus-attention-bias": dict(
        model_type="apertus", attention_bias=True, tie_word_embeddings=True, pad_token_id=0
    ),
}
