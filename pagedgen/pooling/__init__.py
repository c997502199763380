"""Embeddings (vLLM's pooling runner): a prompt's final hidden states pooled into one vector."""

from pagedgen.pooling.config import PoolerConfig
from pagedgen.pooling.params import PoolingParams

__all__ = ["PoolerConfig", "PoolingParams"]
