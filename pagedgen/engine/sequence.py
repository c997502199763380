import time
from enum import Enum, auto
from itertools import count

from pagedgen.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED_STOPPED = auto()
    FINISHED_LENGTH_CAPPED = auto()
    FINISHED_ABORTED = auto()
    FINISHED_IGNORED = auto()

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")


FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "error",
}


class Sequence:
    """One token stream: a prompt and the tokens generated after it.

    num_computed_tokens counts the leading tokens whose K/V sit in the cache. A scheduled step
    computes token_ids[num_computed_tokens : num_computed_tokens + num_new_tokens]; a preemption by
    recompute sets it back to 0 and keeps the generated tokens, which are then prefilled again.
    """

    _ids = count()

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.seq_id = next(Sequence._ids)
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.sampling_params = sampling_params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.output_text = ""
        self.output_logprobs: list[dict[int, float]] = []
        self.stop_reason: int | str | None = None
        self.error: str | None = None

    def __len__(self) -> int:
        return self.num_tokens

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
            f"num_tokens={self.num_tokens}, num_computed_tokens={self.num_computed_tokens})"
        )

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token_id(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def finish(self, status: SequenceStatus, error: str | None = None) -> None:
        assert status.is_finished, status
        self.status = status
        self.error = error
        self.finished_time = time.monotonic()
