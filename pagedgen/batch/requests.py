from typing import Any

from pagedgen.chat_template import apply_chat_template
from pagedgen.io.records import InputRecord
from pagedgen.sampling_params import SamplingParams

MAX_INT64 = 2**63 - 1


class RequestBuilder:
    """Turns an input record into what the engine runs: the prompt's token ids and the record's
    SamplingParams (defaults, then the record's own fields), or the reason it cannot run.

    Text is tokenized here, as the engine would, so that a prompt the tokenizer rejects fails
    alone instead of stopping the batch.
    """

    def __init__(
        self, tokenizer: Any, defaults: dict[str, Any], vocab_size: int, max_num_seqs: int
    ) -> None:
        self.tokenizer = tokenizer
        self.defaults = dict(defaults)
        SamplingParams(**self.defaults)
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs

    def build(self, record: InputRecord) -> tuple[list[int], SamplingParams] | str:
        if record.error is not None:
            return record.error
        try:
            params = SamplingParams(**{**self.defaults, **record.sampling})
        except (TypeError, ValueError) as e:
            return f"invalid sampling parameters: {e}"
        error = self._check_limits(params)
        if error is not None:
            return error
        if record.messages is not None:
            try:
                return apply_chat_template(self.tokenizer, record.messages), params
            except Exception as e:  # a template can reject any conversation it dislikes
                return f"chat template failed: {e}"
        if isinstance(record.prompt, str):
            try:
                return self.tokenizer.encode(record.prompt), params
            except Exception as e:
                return f"cannot tokenize the prompt: {e}"
        assert record.prompt is not None
        bad = next((t for t in record.prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})"
        return record.prompt, params

    def _check_limits(self, params: SamplingParams) -> str | None:
        if params.n > self.max_num_seqs:
            return f"n={params.n} exceeds max_num_seqs ({self.max_num_seqs})"
        if params.logprobs is not None and params.logprobs > self.vocab_size:
            return f"logprobs={params.logprobs} exceeds the vocabulary size ({self.vocab_size})"
        if params.top_k > MAX_INT64:
            return f"top_k={params.top_k} is too large"
        return None


def vocab_size_of(llm_engine: Any) -> int:
    return getattr(llm_engine.hf_config, "vocab_size", None) or len(llm_engine.tokenizer)
