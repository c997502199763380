import copy
import json as json_module
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# SamplingParams' integer fields: always set, and those that may be None
INTEGER_FIELDS = ("n", "top_k", "min_tokens")
OPTIONAL_INTEGER_FIELDS = (
    "seed", "max_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens",
)  # fmt: skip


@dataclass(slots=True)
class StructuredOutputsParams:
    """Constrains a completion to a language (vLLM's names); exactly one field is set.

    json: a JSON schema, as a dict or its JSON text. regex: a regular expression (Rust syntax),
    matched by the whole completion. choice: the completion is one of these strings. grammar: a
    context-free grammar in Lark or GBNF syntax. json_object: any JSON object. JSON is written
    compactly with ", " and ": " separators; a schema's "x-guidance" options may change that.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        kinds = [kind for kind in STRUCTURED_OUTPUT_KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"structured outputs take exactly one of {', '.join(STRUCTURED_OUTPUT_KINDS)}; "
                f"got {', '.join(kinds) or 'none'}"
            )
        choice = self.choice
        checks = [
            (self.json is None or isinstance(self.json, str | dict), "json must be an object"),
            (self.regex is None or _is_text(self.regex), "regex must be a non-empty string"),
            (
                choice is None
                or (isinstance(choice, list) and choice and all(map(_is_text, choice))),
                "choice must be a non-empty list of non-empty strings",
            ),
            (self.grammar is None or _is_text(self.grammar), "grammar must be a non-empty string"),
            (self.json_object is None or self.json_object is True, "json_object must be true"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if isinstance(self.json, str):
            try:
                schema = json_module.loads(self.json)
            except ValueError as e:
                raise ValueError(f"json must be a JSON schema; its text does not parse: {e}") from e
            if not isinstance(schema, dict):
                raise ValueError(f"json must be a JSON schema object, got {self.json[:80]!r}")

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "StructuredOutputsParams":
        """From a JSON object such as an input line's "structured_outputs"."""
        unknown = sorted(set(obj) - set(STRUCTURED_OUTPUT_KINDS))
        if unknown:
            raise ValueError(
                f"unknown structured_outputs fields {unknown}; "
                f"known: {list(STRUCTURED_OUTPUT_KINDS)}"
            )
        return cls(**obj)

    @property
    def key(self) -> tuple[str, str]:
        """(kind, text): requests with equal keys share one compiled grammar."""
        kind = next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None)
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, str):
            value = json_module.loads(value)
        return kind, value if isinstance(value, str) else json_module.dumps(value)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request's completion. Field names and defaults follow vLLM.

    temperature 0 is greedy. top_k 0 (or -1) and top_p 1 disable those filters. seed makes a
    request's samples reproducible whatever else shares its batch. logprobs=k returns, for each
    generated token, its own log-probability and the k most likely tokens'; prompt_logprobs=k
    the same for each prompt token after the first, given the tokens before it (the request then
    computes its whole prompt: no prefix-cache hits). logit_bias adds to the logits of the
    tokens it names before sampling (OpenAI's; JSON's string keys are taken as token ids).
    truncate_prompt_tokens=k keeps the last k tokens of a longer prompt (the chat template's
    output, for messages), as vLLM does. allowed_token_ids restricts every sample to those
    tokens (logprobs stay the raw model's). bad_words are never generated: each word's tokens,
    with and without a leading space, as vLLM bans them (the last token of a sequence whose
    other tokens the output just produced).
    structured_outputs constrains the completion to a JSON schema, a regex, a choice or a
    grammar; it ends (finish reason "stop") as soon as the constraint is complete.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last k tokens
    allowed_token_ids: list[int] | None = None  # sample only among these
    bad_words: list[str] | None = None  # never generated (as vLLM: each word's token sequence)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # False: output text stays empty (token ids only)
    structured_outputs: StructuredOutputsParams | None = None  # or a dict of its fields
    # Filled from the tokenizer by the engine; not part of vLLM's public surface.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    # Derived by __post_init__, so by every copy the engine runs (dataclasses.replace): greedy,
    # with nothing that edits the logits first (penalties, bias, bans, allowed tokens, min_tokens)
    # and no logprobs, this request's every sample is the logits' argmax.
    plain_greedy: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._check_integers()
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = _token_biases(self.logit_bias)
        if isinstance(self.structured_outputs, dict):  # a JSON line's, or the caller's, object
            try:
                self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
            except (TypeError, ValueError) as e:
                raise ValueError(f"structured_outputs: {e}") from e
        if not isinstance(self.structured_outputs, StructuredOutputsParams | None):
            raise ValueError(
                "structured_outputs must be StructuredOutputsParams or a dict of its fields, "
                f"got {type(self.structured_outputs).__name__}"
            )
        checks = [
            (self.n >= 1, "n must be >= 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 or -1 disables it)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.min_tokens >= 0, "min_tokens must be >= 0"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens must be <= max_tokens",
            ),
            (self.logprobs is None or self.logprobs >= 0, "logprobs must be >= 0"),
            (
                self.prompt_logprobs is None or self.prompt_logprobs >= 0,
                "prompt_logprobs must be >= 0",
            ),
            (
                self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1,
                "truncate_prompt_tokens must be >= 1",
            ),
            (
                self.allowed_token_ids is None
                or (bool(self.allowed_token_ids) and min(self.allowed_token_ids) >= 0),
                "allowed_token_ids must be a non-empty list of token ids",
            ),
            (all(self.stop), "stop strings must not be empty"),
            (all(self.bad_words or ()), "bad words must not be empty"),
            (self.detokenize or not self.stop, "stop strings need detokenize=True"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message}, got {self._field_values()}")
        self.plain_greedy = (
            self.temperature == 0
            and self.logprobs is None
            and self.min_tokens == 0
            and self.repetition_penalty == 1.0
            and not (self.presence_penalty or self.frequency_penalty)
            and not (self.logit_bias or self.allowed_token_ids or self.bad_words_token_ids)
        )

    def _check_integers(self) -> None:
        """Integer fields hold integers (numpy's too, made int); a float there would fail deep
        in a step, with every request of the batch."""
        for name in (*INTEGER_FIELDS, *OPTIONAL_INTEGER_FIELDS):
            value = getattr(self, name)
            if value is None and name in OPTIONAL_INTEGER_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            setattr(self, name, int(value))
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, name) or ()
            if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
                raise ValueError(f"{name} must be token ids (integers), got {ids!r}")

    def clone(self) -> "SamplingParams":
        """A deep copy (vLLM's)."""
        return copy.deepcopy(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_engine(self, tokenizer: Any, eos_token_ids: set[int]) -> "SamplingParams":
        """A copy with what the engine derives from its tokenizer: the stop token ids (eos too,
        unless ignore_eos) and the bad words' token ids."""
        stop_ids = set(self.stop_token_ids)
        if not self.ignore_eos:
            stop_ids |= eos_token_ids
        if self.bad_words and tokenizer is None:
            raise ValueError("bad_words need a tokenizer; this engine has none")
        bad = bad_words_token_ids(tokenizer, self.bad_words) if self.bad_words else []
        return replace(self, all_stop_token_ids=stop_ids, bad_words_token_ids=bad)

    def token_outside(self, vocab_size: int) -> int | None:
        """A token id logit_bias, allowed_token_ids or stop_token_ids names past the vocabulary,
        if any."""
        named = [*(self.logit_bias or ()), *(self.allowed_token_ids or ()), *self.stop_token_ids]
        return first_outside_vocabulary(named, vocab_size)

    def truncated(self, prompt_token_ids: list[int]) -> list[int]:
        """The prompt as this request runs it: its last truncate_prompt_tokens tokens."""
        k = self.truncate_prompt_tokens
        return prompt_token_ids[-k:] if k is not None else prompt_token_ids

    def _field_values(self) -> str:
        names = ("n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens")
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in names)


def first_outside_vocabulary(token_ids: list[int], vocab_size: int) -> int | None:
    """The first id of token_ids outside [0, vocab_size) (only a negative one where vocab_size
    is 0, unknown), or None. A prompt's ids are checked by min and max first, in C."""
    if not token_ids or (min(token_ids) >= 0 and (vocab_size <= 0 or max(token_ids) < vocab_size)):
        return None
    return next(t for t in token_ids if t < 0 or t >= vocab_size > 0)


def _token_biases(biases: Any) -> dict[int, float]:
    """logit_bias as {token id: bias}: keys ints or their decimal strings, biases in [-100, 100]."""
    if not isinstance(biases, dict):
        raise ValueError(f"logit_bias must map token ids to biases, got {type(biases).__name__}")
    result = {}
    for key, bias in biases.items():
        token_id = key
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token_id = int(key)
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {bias!r}")
        result[token_id] = float(bias)
    return result


def bad_words_token_ids(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids as vLLM bans them: the word as written (leading spaces dropped)
    and, where it spells differently, with one leading space (the word inside a text)."""
    sequences = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        sequences.append(bare)
        if spaced and bare and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return [ids for ids in sequences if ids]
