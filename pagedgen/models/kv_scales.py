"""A checkpoint's calibrated KV-cache scales (vLLM's k_scale and v_scale: compressed-tensors'
kv_cache_scheme, AutoFP8's k_proj/v_proj output_scale), one per attention layer: an 8-bit cache
stores k / k_scale and v / v_scale (LlamaAttention.use_kv_scales)."""

import torch

# checkpoint name suffix -> the attention module's attribute
SUFFIXES = {
    ".self_attn.k_scale": "k_scale",
    ".self_attn.v_scale": "v_scale",
    ".self_attn.k_proj.output_scale": "k_scale",
    ".self_attn.v_proj.output_scale": "v_scale",
}


def kv_scale_of(name: str) -> tuple[str, str] | None:
    """(the attention module's name, "k_scale" or "v_scale") of a KV scale tensor, else None."""
    for suffix, attribute in SUFFIXES.items():
        if name.endswith(suffix):
            return name.removesuffix(suffix) + ".self_attn", attribute
    return None


def scale_value(name: str, tensor: torch.Tensor) -> float:
    """The one value of a per-tensor scale; per-head scales are refused, as vLLM's CPU and
    default CUDA backends do."""
    if tensor.numel() != 1:
        raise ValueError(f"{name}: per-head KV scales ({tuple(tensor.shape)}) are not supported")
    value = float(tensor.float().reshape(()))
    if not value > 0:
        raise ValueError(f"{name}: a KV scale must be positive, got {value}")
    return value
