from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.selector import get_attention_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
