from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.layer import Attention
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.selector import get_attention_backend
from pagedgen.attention.spec import AttentionSpec

__all__ = [
    "Attention",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "get_attention_backend",
]
