from dataclasses import dataclass

from pagedgen.loader.resolve import DEFAULT_MODEL

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "cupy", "reference")


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine is built from; names follow vLLM's engine arguments.

    kv_cache_memory is the KV pool's size in GiB; None picks a default for the device (see
    LLMEngine). The pool is never sized from max_model_len x max_num_seqs.
    """

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    attention_backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be 8, 16, 32, 64 or 128, got {self.block_size}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 GiB, got {self.kv_cache_memory}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
