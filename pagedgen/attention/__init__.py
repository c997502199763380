from pagedgen.attention.backend import AttentionBackend, get_attention_backend
from pagedgen.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
