"""What the KV cache holds per token and how many blocks a memory budget buys; computed here
and nowhere else (the engine, the model runner and `pagedgen profile` all ask)."""

from typing import Any, NamedTuple, Protocol

from pagedgen.model_config import head_dim_of, is_mla, num_kv_heads_of

GIB = 1 << 30
DEFAULT_CPU_KV_CACHE_GIB = 4.0


class DType(Protocol):  # torch.dtype, without importing torch
    itemsize: int


class KVGeometry(NamedTuple):
    """What one token's K and V take in the cache: 2 x layers x kv heads x head dim x dtype.
    With latent (MLA), K and V are one vector, the compressed KV and the rotary key part
    (kv_lora_rank + qk_rope_head_dim), cached once: layers x 1 x that x dtype."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    latent: bool = False

    @classmethod
    def of(cls, hf_config: Any, dtype: DType) -> "KVGeometry":
        name = str(dtype).removeprefix("torch.")
        num_layers = hf_config.num_hidden_layers
        if is_mla(hf_config):
            latent_dim = hf_config.kv_lora_rank + hf_config.qk_rope_head_dim
            return cls(num_layers, 1, latent_dim, name, dtype.itemsize, latent=True)
        num_kv_heads = num_kv_heads_of(hf_config)
        return cls(num_layers, num_kv_heads, head_dim_of(hf_config), name, dtype.itemsize)

    @property
    def num_caches(self) -> int:
        """Tensors a layer caches per token: K and V, or MLA's one latent serving as both."""
        return 1 if self.latent else 2

    @property
    def bytes_per_token(self) -> int:
        return (
            self.num_caches * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
        )

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """The pool: [num_layers, 2 (K, V) or 1 (latent), num_blocks, block_size, num_kv_heads,
        head_dim]."""
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        return (self.num_layers, self.num_caches, *shape)

    @property
    def formula(self) -> str:
        size = f"{self.dtype_bytes} bytes ({self.dtype})"
        if self.latent:
            return f"{self.num_layers} layers x {self.head_dim} latent dim x {size}"
        return (
            f"2 x {self.num_layers} layers x {self.num_kv_heads} kv heads x {self.head_dim} "
            f"head dim x {size}"
        )


class PoolSize(NamedTuple):
    num_blocks: int  # device blocks
    num_cpu_blocks: int  # the swap pool's


def size_kv_pool(
    geometry: KVGeometry, block_size: int, kv_cache_bytes: float, swap_space_bytes: float
) -> PoolSize:
    """Blocks of block_size tokens that the budgets hold; at least one device block."""
    bytes_per_block = geometry.bytes_per_block(block_size)
    num_blocks = int(kv_cache_bytes // bytes_per_block)
    if num_blocks < 1:
        raise ValueError(
            f"a KV cache of {kv_cache_bytes / GIB:.3g} GiB holds no block of {block_size} tokens "
            f"({bytes_per_block} bytes: {geometry.formula} x {block_size})"
        )
    return PoolSize(num_blocks, int(swap_space_bytes // bytes_per_block))
