"""Tiny configurations of the ALiBi models: BLOOM, MPT and Falcon's alibi variant (falcon-rw).

Their configs name no num_key_value_heads (every head has its K/V, or Falcon's multi_query and
num_kv_heads say): None undoes COMMON's 2. Head counts that are no power of two take the slope
functions' extra heads (BLOOM's and Falcon's interleaved odd powers, MPT's reorder).

Falcon's transformers code rounds each bias, slope x position, to bfloat16, which no per-head
slope reproduces: its configs have 8 heads at most, whose slopes are powers of two, so that
those products are exact (layers/alibi.py's tests check the slopes for more heads)."""

CONFIGS: dict[str, dict] = {
    "bloom": dict(  # 6 heads: 4 + 2 extra slopes
        model_type="bloom", num_key_value_heads=None, num_attention_heads=6, hidden_size=96
    ),
    "bloom-post-norm-residual": dict(  # residuals from the norms' outputs; 12 heads; own LM head
        model_type="bloom",
        num_key_value_heads=None,
        num_attention_heads=12,
        hidden_size=96,
        apply_residual_connection_post_layernorm=True,
        tie_word_embeddings=False,
    ),
    "mpt": dict(  # 6 heads of the 8's slopes, odd ones first
        model_type="mpt",
        num_key_value_heads=None,
        num_attention_heads=6,
        hidden_size=96,
        max_seq_len=256,
    ),
    "mpt-clip-qkv": dict(  # q/k/v clamped; its own softmax scale
        model_type="mpt",
        num_key_value_heads=None,
        max_seq_len=256,
        attn_config=dict(clip_qkv=1.5, softmax_scale=0.2),
    ),
    "falcon-rw": dict(  # falcon-rw-1b's layout: sequential, every head its K/V, biased
        model_type="falcon",
        num_key_value_heads=None,
        alibi=True,
        multi_query=False,
        parallel_attn=False,
        bias=True,
        num_attention_heads=6,
        hidden_size=96,
        ffn_hidden_size=128,
    ),
    "falcon-alibi-multi-query": dict(  # falcon-7b's parallel block and one K/V head, with alibi
        model_type="falcon",
        num_key_value_heads=None,
        alibi=True,
        multi_query=True,
        parallel_attn=True,
        num_attention_heads=8,
        ffn_hidden_size=128,
    ),
    "falcon-alibi-new-architecture": dict(  # falcon-40b's two K/V groups and norms, with alibi
        model_type="falcon",
        alibi=True,
        new_decoder_architecture=True,
        num_kv_heads=2,
        ffn_hidden_size=128,
    ),
}
