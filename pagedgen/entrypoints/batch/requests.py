import math
from typing import Any, NamedTuple

from pagedgen.entrypoints.chat_template import ChatTemplate, apply_chat_template
from pagedgen.entrypoints.io.records import POOLING_FIELDS, InputRecord
from pagedgen.entrypoints.io.tools import parses_tool_calls, tool_schema
from pagedgen.lora.request import LoRARequest
from pagedgen.pooling.params import PoolingParams
from pagedgen.sampling_params import SamplingParams, first_outside_vocabulary

MAX_INT64 = 2**63 - 1
MAX_UTF8_BYTES_PER_CHAR = 4


class RequestError(Exception):
    """Why one input record cannot run; the job writes it as that record's error line."""


class PreparedRequest(NamedTuple):
    prompt: list[int]  # token ids
    params: SamplingParams | PoolingParams


def sampling_defaults(defaults: dict[str, Any]) -> SamplingParams:
    """The SamplingParams every record starts from; raises ValueError for a bad one."""
    for name, value in defaults.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    return SamplingParams(**defaults)


class RequestBuilder:
    """Turns an input record into what the engine runs: the prompt's token ids and the record's
    SamplingParams (defaults, then the record's own fields), or the reason it cannot run.

    Text is tokenized here, as the engine would, so that a prompt the tokenizer rejects fails
    alone instead of stopping the batch. A text longer than max_model_len tokens could ever
    spell is rejected from its length without being tokenized: the cost of a prompt is bounded
    by what the model can take, not by the size of the line.

    For a pooling job (embed, classify), a record's fields are PoolingParams' (dimensions,
    use_activation, truncate_prompt_tokens) and the defaults, sampling fields, do not apply.
    """

    def __init__(
        self,
        tokenizer: Any,
        defaults: dict[str, Any],
        vocab_size: int,
        max_num_seqs: int,
        max_model_len: int | None = None,
        loras: dict[str, LoRARequest] | None = None,
        chat_template: ChatTemplate = ChatTemplate(),
        tool_call_parser: str | None = None,
        pooling: str | None = None,  # a pooling job's task: embed or classify
    ) -> None:
        self.pooling = pooling
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.tool_call_parser = tool_call_parser
        self.loras = loras or {}
        self.defaults = dict(defaults)
        sampling_defaults(self.defaults)
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_prompt_bytes = None
        if max_model_len is not None:
            self.max_prompt_bytes = max_model_len * max_bytes_per_token(tokenizer)

    def prepare(self, record: InputRecord) -> PreparedRequest:
        """The request for record; raises RequestError if it cannot run."""
        if record.error is not None:
            raise RequestError(record.error)
        if self.chat_template.apply_to_prompts and isinstance(record.prompt, str):
            record = record._replace(
                prompt=None, messages=[{"role": "user", "content": record.prompt}]
            )
        if self.pooling is not None:
            params = self._pooling_params(record, self.pooling)
        else:
            params = self._sampling_params(record)
        if isinstance(params, SamplingParams):
            self._check_limits(params)
        if params.truncate_prompt_tokens is None:  # else a prompt of any length is cut down
            self._check_length(record)
        if record.messages is not None:
            if parses_tool_calls(record.chat) and self.tool_call_parser is None:
                raise RequestError("tools with tool_choice 'auto' need --tool-call-parser")
            try:
                prompt = apply_chat_template(
                    self.tokenizer, record.messages, self.chat_template, **record.chat
                )
            except Exception as e:  # a template can reject any conversation it dislikes
                raise RequestError(f"chat template failed: {e}") from e
            return PreparedRequest(params.truncated(prompt), params)
        if isinstance(record.prompt, str):
            try:
                return PreparedRequest(
                    params.truncated(self.tokenizer.encode(record.prompt)), params
                )
            except Exception as e:  # tokenizers raise their own kinds
                raise RequestError(f"cannot tokenize the prompt: {e}") from e
        assert record.prompt is not None
        prompt = params.truncated(record.prompt)
        if self.max_model_len is not None and len(prompt) > self.max_model_len:
            raise RequestError(
                f"the prompt's {len(prompt)} tokens exceed max_model_len ({self.max_model_len})"
            )
        self._check_vocab(prompt, "token id")
        return PreparedRequest(prompt, params)

    def _sampling_params(self, record: InputRecord) -> SamplingParams:
        if record.endpoint == "embeddings":
            raise RequestError("/v1/embeddings needs an embedding job: --runner pooling")
        embedding_only = sorted(set(record.sampling) & set(POOLING_FIELDS))
        if embedding_only:
            raise RequestError(f"{embedding_only[0]!r} is for embeddings (--runner pooling)")
        sampling = {**self.defaults, **record.sampling}
        schema = tool_schema(record.chat) if record.messages is not None else None
        if schema is not None:  # tool_choice required or a function: vLLM constrains the answer
            if sampling.get("structured_outputs") is not None:
                raise RequestError("give one of a forced 'tool_choice' and structured output")
            sampling["structured_outputs"] = {"json": schema}
        try:
            return SamplingParams(**sampling)
        except (TypeError, ValueError) as e:
            raise RequestError(f"invalid sampling parameters: {e}") from e

    def _pooling_params(self, record: InputRecord, task: str) -> PoolingParams:
        if task == "classify" and record.endpoint is not None:
            raise RequestError("a classification job takes pagedgen's lines, not OpenAI's")
        if record.endpoint not in (None, "embeddings"):
            raise RequestError("an embedding job (--runner pooling) takes /v1/embeddings requests")
        sampling_only = sorted(set(record.sampling) - {*POOLING_FIELDS, "truncate_prompt_tokens"})
        if sampling_only:
            raise RequestError(f"{sampling_only[0]!r} is a sampling field; this job pools ({task})")
        if record.chat.get("tools"):
            raise RequestError(f"'tools' are for generation; this job pools ({task})")
        try:
            return PoolingParams(**record.sampling, task=task)
        except ValueError as e:
            raise RequestError(f"invalid pooling parameters: {e}") from e

    def lora_of(self, record: InputRecord) -> LoRARequest | None:
        """The adapter a record runs with: its "lora" (which must be one of loras), or an
        OpenAI body's model where that names one (vLLM's batch runner picks adapters so; any
        other model is a label); raises RequestError for an unknown adapter."""
        if record.lora is not None:
            lora = self.loras.get(record.lora)
            if lora is None:
                known = ", ".join(sorted(self.loras)) or "none were given"
                raise RequestError(
                    f"unknown LoRA adapter {record.lora!r} (--lora-modules names: {known})"
                )
            return lora
        return self.loras.get(record.model) if record.model is not None else None

    def _check_limits(self, params: SamplingParams) -> None:
        if params.n > self.max_num_seqs:
            raise RequestError(f"n={params.n} exceeds max_num_seqs ({self.max_num_seqs})")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.vocab_size:
                raise RequestError(f"{name}={k} exceeds the vocabulary size ({self.vocab_size})")
        if params.top_k > MAX_INT64:
            raise RequestError(f"top_k={params.top_k} is too large")
        self._check_vocab(params.stop_token_ids or [], "stop token id")
        self._check_vocab(list(params.logit_bias or ()), "logit_bias token id")
        self._check_vocab(params.allowed_token_ids or [], "allowed token id")

    def _check_vocab(self, token_ids: list[int], what: str) -> None:
        bad = first_outside_vocabulary(token_ids, self.vocab_size)
        if bad is not None:
            raise RequestError(f"{what} {bad} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _check_length(self, record: InputRecord) -> None:
        if self.max_prompt_bytes is None or isinstance(record.prompt, list):
            return
        if record.messages is not None:
            texts = [message["content"] or "" for message in record.messages]  # None: calls
        else:
            texts = [record.prompt or ""]
        if sum(map(len, texts)) * MAX_UTF8_BYTES_PER_CHAR <= self.max_prompt_bytes:
            return
        num_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if num_bytes > self.max_prompt_bytes:
            raise RequestError(
                f"the prompt's {num_bytes:,} bytes are more than max_model_len "
                f"({self.max_model_len}) tokens can hold"
            )


def max_bytes_per_token(tokenizer: Any) -> int:
    """An upper bound on the UTF-8 bytes of text that one token stands for.

    A vocabulary entry as spelled never takes fewer bytes than the text it stands for (a
    byte-level spelling takes 1 or 2 bytes per byte, SentencePiece's '▁' 3 for a space), so the
    longest entry bounds a token's text, added tokens included. A normalizer may shrink the text
    first, by at most 3x (NFC makes one 3-byte Hangul syllable of three 3-byte jamo).
    """
    vocab = tokenizer.get_vocab()
    longest = max((len(token.encode("utf-8", "surrogatepass")) for token in vocab), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return longest * (1 if backend is not None and backend.normalizer is None else 3)


def vocab_size_of(llm_engine: Any) -> int:
    return getattr(llm_engine.hf_config, "vocab_size", None) or len(llm_engine.tokenizer)
