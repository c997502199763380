"""pagedgen: offline batch generation with a paged KV cache and continuous batching.

The names below load on first use, so that the control plane (pagedgen.core) and the engine
loop import without torch.
"""

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "pagedgen.entrypoints.llm",
    "Logprob": "pagedgen.outputs",
    "LoRARequest": "pagedgen.lora.request",
    "BeamSearchParams": "pagedgen.core.beam_search",
    "ClassificationOutput": "pagedgen.outputs",
    "ClassificationRequestOutput": "pagedgen.outputs",
    "CompletionOutput": "pagedgen.outputs",
    "EmbeddingOutput": "pagedgen.outputs",
    "EmbeddingRequestOutput": "pagedgen.outputs",
    "PoolerConfig": "pagedgen.pooling.config",
    "PoolingParams": "pagedgen.pooling.params",
    "PoolingRequestOutput": "pagedgen.outputs",
    "EngineConfig": "pagedgen.config",
    "RequestOutput": "pagedgen.outputs",
    "SamplingParams": "pagedgen.sampling_params",
    "ScoringOutput": "pagedgen.outputs",
    "ScoringRequestOutput": "pagedgen.outputs",
    "StructuredOutputsParams": "pagedgen.sampling_params",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pagedgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
