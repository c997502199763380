"""pagedgen: offline batch generation with a paged KV cache and continuous batching."""

from pagedgen.config import EngineConfig
from pagedgen.engine.beam_search import BeamSearchParams
from pagedgen.llm import LLM
from pagedgen.outputs import CompletionOutput, RequestOutput
from pagedgen.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineConfig",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"
