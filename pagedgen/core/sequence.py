import copy
import time
from collections.abc import Hashable, Iterator
from dataclasses import replace
from enum import Enum, auto

from pagedgen.pooling.params import PoolingParams
from pagedgen.sampling_params import SamplingParams

PLACEHOLDER = -1  # a token id the device has sampled and the host does not know yet


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED_STOPPED = auto()
    FINISHED_LENGTH_CAPPED = auto()
    FINISHED_ABORTED = auto()
    FINISHED_IGNORED = auto()

    # Statuses are hashed on the scheduler's hot path (FINISHED_STATUSES): by identity, in C,
    # rather than by Enum's hash of the name, in Python. Members are singletons, so it agrees
    # with ==.
    __hash__ = object.__hash__

    @property
    def is_finished(self) -> bool:
        return self in FINISHED_STATUSES


FINISHED_STATUSES = frozenset(s for s in SequenceStatus if s.name.startswith("FINISHED"))
FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "error",
}


class Sequence:
    """One token stream: a prompt and the tokens generated after it.

    num_computed_tokens counts the leading tokens whose K/V sit in the cache once the step
    scheduled last has run; only the scheduler changes it (Scheduler._update_after_schedule, and
    back to 0 on a preemption by recompute, which keeps the generated tokens to prefill again).
    seq_id is unique within one scheduler, which hands them out.

    spec_token_ids are draft tokens proposed to follow token_ids (speculative decoding), not yet
    part of them: a step that schedules them computes them after the last token, and the
    scheduler trims them to what it scheduled.

    With async scheduling, the last num_output_placeholders tokens (0 or 1) are PLACEHOLDER: a
    token sampled on the device by a step still in flight, counted in every length so the next
    step can be scheduled before the host knows it, and replaced by resolve_placeholder.
    """

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        lora_int_id: int = 0,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.sampling_params = sampling_params
        # An embedding request's (vLLM's pooling runner): its prompt is pooled, never sampled.
        self.pooling_params: PoolingParams | None = None
        self.lora_int_id = lora_int_id  # the LoRA adapter it runs with; 0: none
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # block_table[:num_synced_blocks] is unchanged since the model runner last copied it
        # (BlockTables.sync): the block manager lowers it whenever it rewrites an entry.
        self.num_synced_blocks = 0
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] = []
        # Content hashes of the full blocks of token_ids, chained; the first num_cached_blocks
        # blocks of block_table are indexed in the prefix cache.
        self.block_hashes: list[Hashable] = []
        self.num_cached_blocks = 0
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.output_text = ""
        self.output_logprobs: list[dict[int, float]] = []
        self.cumulative_logprob = 0.0
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
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token_id(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def append_placeholder(self) -> None:
        self.token_ids.append(PLACEHOLDER)
        self.output_token_ids.append(PLACEHOLDER)
        self.num_output_placeholders += 1

    def resolve_placeholder(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        """The sampled token of the last placeholder, now on the host."""
        assert self.num_output_placeholders == 1 and self.token_ids[-1] == PLACEHOLDER, self
        self.num_output_placeholders = 0
        self.token_ids[-1] = self.output_token_ids[-1] = token_id
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def drop_placeholders(self) -> None:
        """Forgets the tokens still in flight (an aborted sequence never gets them)."""
        if self.num_output_placeholders:
            del self.token_ids[-self.num_output_placeholders :]
            del self.output_token_ids[-self.num_output_placeholders :]
            self.num_output_placeholders = 0

    def finish(self, status: SequenceStatus, error: str | None = None) -> None:
        assert status.is_finished, status
        self.status = status
        self.error = error
        self.finished_time = time.monotonic()

    def with_drafts(self, drafts: list[int]) -> "Sequence":
        """A detached copy with drafts appended as output tokens, as the model sees them."""
        preview = self.fork(self.seq_id)
        preview.token_ids += drafts
        preview.output_token_ids += drafts
        return preview

    def set_block_table(self, block_table: list[int]) -> None:
        """A new table, which the model runner has none of yet."""
        self.block_table = block_table
        self.num_synced_blocks = 0

    def fork(self, seq_id: int, sampling_params: SamplingParams | None = None) -> "Sequence":
        """A new sequence with this one's tokens and progress; the caller shares the blocks."""
        child = copy.copy(self)
        child.seq_id = seq_id
        child.sampling_params = sampling_params or self.sampling_params
        for name in ("token_ids", "output_token_ids", "output_logprobs", "block_hashes"):
            setattr(child, name, list(getattr(self, name)))
        child.set_block_table([])
        child.spec_token_ids = []
        return child


class SequenceGroup:
    """A request's sequences: one, the n samples of parallel sampling, or the beams of a search.

    The group is the unit the scheduler admits, preempts and swaps. A group waiting for its
    first prefill holds one sequence; the n - 1 siblings are forked from it, sharing its blocks,
    in the step that finishes the prompt.
    """

    def __init__(
        self,
        request_id: str,
        seq: Sequence,
        sampling_params: SamplingParams,
        max_num_seqs: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.seqs = [seq]
        self.sampling_params = sampling_params
        self.arrival_time = seq.arrival_time
        self.max_num_seqs = max_num_seqs or sampling_params.n  # beam search: beam_width
        self.lora_int_id = seq.lora_int_id
        # Prompt tokens found in the prefix cache when the group was first admitted.
        self.num_cached_tokens: int | None = None

    def __repr__(self) -> str:
        return f"SequenceGroup({self.request_id!r}, {self.seqs})"

    @property
    def unfinished_seqs(self) -> list[Sequence]:
        if len(self.seqs) == 1:  # the common case, on the scheduler's hot path
            return [] if self.seqs[0].status in FINISHED_STATUSES else self.seqs
        return [seq for seq in self.seqs if seq.status not in FINISHED_STATUSES]

    @property
    def is_finished(self) -> bool:
        return not self.unfinished_seqs

    @property
    def num_pending_forks(self) -> int:
        return self.sampling_params.n - len(self.seqs)

    def fork_samples(self, parent: Sequence, seq_ids: Iterator[int]) -> list[Sequence]:
        """Forks the siblings of parallel sampling; sample i draws from seed + i."""
        params = self.sampling_params
        children = []
        for index in range(len(self.seqs), params.n):
            seed = None if params.seed is None else params.seed + index
            children.append(parent.fork(next(seq_ids), replace(parent.sampling_params, seed=seed)))
        self.seqs.extend(children)
        return children
