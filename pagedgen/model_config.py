"""What the engine and the models read from a Hugging Face config, without torch: head sizes,
K/V heads, latent attention (MLA) and which layers attend through a sliding window (the
control plane frees KV blocks by it)."""

from typing import Any


def head_dim_of(hf_config: Any) -> int:
    """A model's attention head size: the config's head_dim, else hidden_size / heads."""
    return getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )


def num_kv_heads_of(hf_config: Any) -> int:
    """A layer's K/V heads: num_key_value_heads; where a config names none, Falcon's
    (num_kv_heads with the new decoder architecture, one with multi_query), else every head."""
    heads = hf_config.num_attention_heads
    if n := getattr(hf_config, "num_key_value_heads", None):
        return n
    if getattr(hf_config, "new_decoder_architecture", False):
        return getattr(hf_config, "num_kv_heads", None) or heads
    return 1 if getattr(hf_config, "multi_query", False) else heads


def is_mla(hf_config: Any) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3): a token caches one latent vector."""
    return getattr(hf_config, "kv_lora_rank", None) is not None


def layer_sliding_windows(hf_config: Any) -> list[int | None]:
    """Per layer, the number of most recent tokens (itself included) a query attends to, or None
    for full attention. Token q sees key k iff q - window < k <= q, as transformers'
    sliding_window_overlay.

    Configs that name layer_types (Gemma 2/3, Qwen2 through its config class) say it per layer,
    GPT-Neo's attention_layers too ("local" layers slide over window_size tokens);
    Qwen2 read from a plain config.json has use_sliding_window and max_window_layers (layers from
    max_window_layers on slide); Mistral v0.1's sliding_window covers every layer.
    """
    num_layers = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    model_type = getattr(hf_config, "model_type", None)
    if model_type == "gpt_neo":  # attention_layers: "global" or "local" (window_size) by layer
        return _gpt_neo_windows(hf_config)
    if model_type in ("qwen2", "smollm3") and not getattr(hf_config, "use_sliding_window", False):
        window = None
    if not window:
        return [None] * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if model_type == "qwen2":
        first = getattr(hf_config, "max_window_layers", num_layers)
        return [window if i >= first else None for i in range(num_layers)]
    if model_type in ("gemma2", "gemma3_text", "gemma3"):
        raise ValueError(f"a {model_type} config without layer_types")
    return [window] * num_layers


def _gpt_neo_windows(hf_config: Any) -> list[int | None]:
    kinds = hf_config.attention_layers
    if set(kinds) - {"global", "local"} or len(kinds) != hf_config.num_hidden_layers:
        raise ValueError(f"GPT-Neo attention_layers {kinds} is not one global/local per layer")
    return [hf_config.window_size if kind == "local" else None for kind in kinds]


def freeable_window(hf_config: Any) -> int | None:
    """The window past which a KV block is out of every layer's reach, so the block manager may
    free it; None when some layer attends to everything."""
    windows = layer_sliding_windows(hf_config)
    if any(window is None for window in windows):
        return None
    return max(windows)  # type: ignore[type-var]
