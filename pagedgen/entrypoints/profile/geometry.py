"""The KV pool a simulation sizes, as the engine would size it, without loading the model."""

from typing import Any

import torch

from pagedgen.attention.kv_cache_dtype import resolve_kv_cache_dtype
from pagedgen.config import EngineConfig
from pagedgen.core.kv_geometry import DEFAULT_CPU_KV_CACHE_GIB, GIB, KVGeometry
from pagedgen.engine.model_setup import pick_dtype


def simulated_geometry(config: EngineConfig, hf_config: Any) -> KVGeometry:
    """The geometry of the cache the engine would build for config, without touching a device."""
    on_gpu = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    dtype = pick_dtype(config.dtype, torch.device("cuda" if on_gpu else "cpu"))
    return KVGeometry.of(hf_config, resolve_kv_cache_dtype(config.kv_cache_dtype, dtype))


def simulated_kv_bytes(config: EngineConfig) -> float:
    """The pool a simulation sizes: --kv-cache-memory, else the engine's CPU default."""
    gib = config.kv_cache_memory if config.kv_cache_memory is not None else DEFAULT_CPU_KV_CACHE_GIB
    return gib * GIB
