from dataclasses import dataclass, replace
from typing import Any

from pagedgen.pooling.config import TASKS


@dataclass(slots=True)
class PoolingParams:
    """vLLM's PoolingParams, for LLM.embed and LLM.classify: dimensions keeps the first k of
    the pooled vector (Matryoshka embeddings: only for a model trained so, as vLLM checks),
    before normalizing; use_activation (None: the pooler config's) scales it to unit length, as
    embedding poolers do, and a classifier's logits into scores; truncate_prompt_tokens=k pools
    only the prompt's last k tokens. task ("embed", "classify"; None: the engine's) is set by
    LLM.embed and LLM.classify."""

    dimensions: int | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(
                f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}"
            )

    def truncated(self, prompt_token_ids: list[int]) -> list[int]:
        k = self.truncate_prompt_tokens
        return prompt_token_ids[-k:] if k is not None else prompt_token_ids


def for_runner(params: Any, task: str | None) -> Any:
    """params as an engine of this pooling task (None: a generating engine) runs them, the task
    filled in; raises ValueError for another runner's or task's: vLLM's runners either pool or
    generate, and a pooling model does its one task."""
    if not isinstance(params, PoolingParams):
        if task is not None:
            raise ValueError(f"this engine was built with runner='pooling': use LLM.{task}")
        return params
    if task is None:
        raise ValueError("embed and classify need an engine built with runner='pooling'")
    if params.task not in (None, task):
        raise ValueError(f"this model's pooling task is {task}, not {params.task}")
    return params if params.task == task else replace(params, task=task)


def dimensions_refusal(params: PoolingParams, hf_config: Any) -> str | None:
    """Why a request's dimensions cannot be given, as vLLM checks them: only a model trained
    for Matryoshka embeddings is cut shorter, and only to the sizes it names, if any."""
    if params.dimensions is None:
        return None
    if params.task == "classify":
        return "dimensions are for embeddings, not classification"
    sizes = getattr(hf_config, "matryoshka_dimensions", None)
    if not (sizes or getattr(hf_config, "is_matryoshka", False)):
        return "the model does not support Matryoshka embeddings: dimensions cannot be set"
    if sizes and params.dimensions not in sizes:
        return f"the model supports Matryoshka dimensions {sorted(sizes)} only"
    hidden_size = getattr(hf_config, "hidden_size", None)
    if hidden_size is not None and params.dimensions > hidden_size:
        return f"dimensions {params.dimensions} exceeds the embedding size {hidden_size}"
    return None
