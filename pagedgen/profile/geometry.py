from typing import Any, NamedTuple

import torch

from pagedgen.config import EngineConfig
from pagedgen.engine.llm_engine import DEFAULT_CPU_KV_CACHE_GIB, GIB


class KVGeometry(NamedTuple):
    """What one token's K and V take in the cache: 2 x layers x kv heads x head dim x dtype."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int

    @classmethod
    def of(cls, hf_config: Any, dtype: torch.dtype) -> "KVGeometry":
        num_heads = hf_config.num_attention_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        name = str(dtype).removeprefix("torch.")
        return cls(hf_config.num_hidden_layers, num_kv_heads, head_dim, name, dtype.itemsize)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def formula(self) -> str:
        return (
            f"2 x {self.num_layers} layers x {self.num_kv_heads} kv heads x {self.head_dim} "
            f"head dim x {self.dtype_bytes} bytes ({self.dtype})"
        )


def simulated_dtype(config: EngineConfig) -> torch.dtype:
    """The dtype LLMEngine would pick, without touching a device."""
    if config.dtype != "auto":
        return getattr(torch, config.dtype)
    on_gpu = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    return torch.bfloat16 if on_gpu else torch.float32


def simulated_kv_bytes(config: EngineConfig) -> float:
    """The pool a simulation sizes: --kv-cache-memory, else the engine's CPU default."""
    gib = config.kv_cache_memory if config.kv_cache_memory is not None else DEFAULT_CPU_KV_CACHE_GIB
    return gib * GIB
