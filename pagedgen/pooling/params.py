from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class PoolingParams:
    """vLLM's PoolingParams for LLM.embed: dimensions keeps the first k of the pooled vector
    (Matryoshka embeddings: only for a model trained so, as vLLM checks), before normalizing;
    use_activation (None: the pooler config's) scales it to unit length, as embedding poolers
    do; truncate_prompt_tokens=k embeds only the prompt's last k tokens."""

    dimensions: int | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(
                f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}"
            )

    def truncated(self, prompt_token_ids: list[int]) -> list[int]:
        k = self.truncate_prompt_tokens
        return prompt_token_ids[-k:] if k is not None else prompt_token_ids


def runner_mismatch(params: object, pooling_runner: bool) -> str | None:
    """Why params cannot run on this engine: vLLM's runners either embed or generate."""
    if isinstance(params, PoolingParams) and not pooling_runner:
        return "embeddings need an engine built with runner='pooling'"
    if pooling_runner and not isinstance(params, PoolingParams):
        return "this engine was built with runner='pooling': it embeds prompts (LLM.embed)"
    return None


def dimensions_refusal(params: PoolingParams, hf_config: Any) -> str | None:
    """Why a request's dimensions cannot be given, as vLLM checks them: only a model trained
    for Matryoshka embeddings is cut shorter, and only to the sizes it names, if any."""
    if params.dimensions is None:
        return None
    sizes = getattr(hf_config, "matryoshka_dimensions", None)
    if not (sizes or getattr(hf_config, "is_matryoshka", False)):
        return "the model does not support Matryoshka embeddings: dimensions cannot be set"
    if sizes and params.dimensions not in sizes:
        return f"the model supports Matryoshka dimensions {sorted(sizes)} only"
    hidden_size = getattr(hf_config, "hidden_size", None)
    if hidden_size is not None and params.dimensions > hidden_size:
        return f"dimensions {params.dimensions} exceeds the embedding size {hidden_size}"
    return None
