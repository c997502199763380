import torch
from torch import nn

from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.spec import AttentionSpec
from pagedgen.layers.rotary import Rope


class Attention(nn.Module):
    """A layer's paged attention: its constants (spec) and the model's shared backend, built
    once; each step's call carries the layer's tensors and the step's metadata only. Models
    call forward and forward_qkv directly: nn.Module's __call__ would add its hook dispatch to
    every layer of every step."""

    def __init__(self, spec: AttentionSpec, backend: AttentionBackend) -> None:
        super().__init__()
        self.spec = spec
        self.backend = backend

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        return self.backend.forward(self.spec, query, key, value, key_cache, value_cache, metadata)

    def forward_qkv(
        self,
        qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_size]
        rope: Rope | None,  # None: no positional rotation
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        return self.backend.forward_qkv(self.spec, qkv, rope, key_cache, value_cache, metadata)

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"num_heads={spec.num_heads}, num_kv_heads={spec.num_kv_heads}, "
            f"head_size={spec.head_size}, scale={spec.scale}, backend={self.backend.name}"
        )
