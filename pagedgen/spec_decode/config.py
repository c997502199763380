from dataclasses import dataclass, fields
from typing import Any

from pagedgen.json_args import json_object

METHODS = ("ngram",)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's speculative_config for its "ngram" method (names and defaults as vLLM's).

    Each step, a decoding sequence proposes up to num_speculative_tokens draft tokens: those that
    followed the latest earlier occurrence of its longest suffix of prompt_lookup_min to
    prompt_lookup_max tokens. The target model computes the last token and the drafts in one
    step and keeps the drafts up to the first one its own sampling disagrees with.

    num_speculative_tokens_per_batch_size (vLLM's dynamic speculative decoding) sets how many
    drafts a step's sequences propose from how many sequences it scheduled: inclusive ranges
    (start, end, k), sorted, the first from 1; a gap or the tail past the last takes the k
    before it; k at most num_speculative_tokens, and 0 drafts none (large batches, where a CPU
    is bound by compute and rejected drafts cost as much as kept tokens).
    """

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 5
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config method must be one of {METHODS}, got {self.method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        if self.num_speculative_tokens_per_batch_size is not None:
            schedule = tuple(map(tuple, self.num_speculative_tokens_per_batch_size))
            object.__setattr__(self, "num_speculative_tokens_per_batch_size", schedule)
            _check_schedule(schedule)
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )

    @classmethod
    def parse(
        cls, value: "SpeculativeConfig | dict[str, Any] | str | None"
    ) -> "SpeculativeConfig | None":
        """The config from vLLM's dict form, or its JSON; None stays None. Unknown keys are an
        error. As in vLLM, num_speculative_tokens is required, and a lookup bound given alone is
        both."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        value = json_object("speculative_config", value)  # the command line's JSON
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; known: {sorted(names)}")
        value = {key: item for key, item in value.items() if item is not None}  # None: default
        for key, item in value.items():
            if key in ("method", "num_speculative_tokens_per_batch_size"):
                continue
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"speculative_config {key} must be an integer, got {item!r}")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs num_speculative_tokens")
        lookup_min, lookup_max = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        if lookup_min is None and lookup_max is not None:
            value["prompt_lookup_min"] = lookup_max
        elif lookup_max is None and lookup_min is not None:
            value["prompt_lookup_max"] = lookup_min
        return cls(**value)

    def num_drafts_at(self, batch_size: int) -> int:
        """How many drafts each sequence proposes after a step of batch_size sequences."""
        k = self.num_speculative_tokens
        for start, _end, num in self.num_speculative_tokens_per_batch_size or ():
            if start > batch_size:
                break
            k = min(num, self.num_speculative_tokens)
        return k


def _check_schedule(schedule: tuple) -> None:
    """vLLM's rules for num_speculative_tokens_per_batch_size."""
    name = "num_speculative_tokens_per_batch_size"
    previous_end = 0
    for entry in schedule:
        if len(entry) != 3 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in entry
        ):
            raise ValueError(f"{name} entries must be (range_start, range_end, k), got {entry}")
        start, end, k = entry
        if not previous_end < start <= end or k < 0:
            raise ValueError(
                f"{name} needs sorted, non-overlapping ranges 1 <= start <= end and k >= 0, "
                f"got {entry}"
            )
        previous_end = end
    if not schedule or schedule[0][0] != 1:
        raise ValueError(f"{name} must start with a range from batch size 1")
