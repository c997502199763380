"""Tiny configurations of Gemma 1, Cohere (Command R) and Cohere2 (Command R7B, Command A)."""

CONFIGS: dict[str, dict] = {
    "gemma": dict(model_type="gemma", head_dim=32, pad_token_id=0),
    "cohere": dict(model_type="cohere", pad_token_id=0, logit_scale=0.5),
    "cohere-qk-norm": dict(  # Command R+: q/k LayerNorms per head, biased projections
        model_type="cohere", pad_token_id=0, use_qk_norm=True, attention_bias=True
    ),
    "cohere2": dict(  # three windowed layers with rotary embeddings, one global without
        model_type="cohere2",
        num_hidden_layers=4,
        sliding_window=8,
        pad_token_id=0,
        logit_scale=0.25,
    ),
}
