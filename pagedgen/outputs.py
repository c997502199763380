from dataclasses import dataclass

from pagedgen.lora.request import LoRARequest


@dataclass(slots=True)
class Logprob:
    """A token's log-probability at one position (vLLM's Logprob): rank counts from 1 in the
    whole vocabulary; decoded_token is the token's text where it was decoded."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One position's logprobs: the chosen token's, then the k likeliest tokens', highest first.
PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    """One of a request's n completions (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    stop_reason: int | str | None = None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    """A finished request: its prompt and completions, or the error that kept it from running."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    error: str | None = None
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache, not computed
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then for each one
    # {its token: Logprob, then the k likeliest tokens'}, from the raw model logits.
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    lora_request: LoRARequest | None = None  # the adapter it ran with, as vLLM reports it

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(out.token_ids) for out in self.outputs)


@dataclass(slots=True)
class EmbeddingOutput:
    """vLLM's EmbeddingOutput: the pooled vector."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class ClassificationOutput:
    """vLLM's ClassificationOutput: a classifier's scores, one per label (its raw logits with
    use_activation=False)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True)
class ScoringOutput:
    """vLLM's ScoringOutput: a pair's similarity score."""

    score: float


@dataclass(slots=True)
class PoolingRequestOutput:
    """A finished pooling request (vLLM's names), or the error that kept it from running (then
    an empty vector)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | ClassificationOutput | ScoringOutput
    metrics: RequestMetrics
    error: str | None = None
    finished: bool = True
    num_cached_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return 0


@dataclass(slots=True)
class EmbeddingRequestOutput(PoolingRequestOutput):
    """LLM.embed's: outputs is an EmbeddingOutput."""


@dataclass(slots=True)
class ClassificationRequestOutput(PoolingRequestOutput):
    """LLM.classify's: outputs is a ClassificationOutput."""


@dataclass(slots=True)
class ScoringRequestOutput(PoolingRequestOutput):
    """LLM.score's, one per pair: outputs is a ScoringOutput."""
