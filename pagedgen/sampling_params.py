from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request's completion. Field names and defaults follow vLLM.

    temperature 0 is greedy. top_k 0 (or -1) and top_p 1 disable those filters. seed makes a
    request's samples reproducible whatever else shares its batch. logprobs=k returns, for each
    generated token, its own log-probability and the k most likely tokens'.
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
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # False: output text stays empty (token ids only)
    # Filled from the tokenizer by the engine; not part of vLLM's public surface.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
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
            (all(self.stop), "stop strings must not be empty"),
            (self.detokenize or not self.stop, "stop strings need detokenize=True"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message}, got {self._field_values()}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def _field_values(self) -> str:
        names = ("n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens")
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
