from collections import deque
from typing import NamedTuple

from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.sequence import Sequence, SequenceStatus


class SchedulerOutput(NamedTuple):
    """One step's work: seqs[i] computes its next num_new_tokens[i] tokens. Decodes come first."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    preempted: list[Sequence]

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    """First-come first-served continuous batching over a BlockManager; plain Python, no torch.

    At every step running sequences decode first (each needs one slot); when the pool runs dry
    the most recently admitted running sequence is preempted by recompute: its blocks are freed
    and it returns to the front of the waiting queue. Then waiting sequences are admitted in
    arrival order while max_num_seqs, max_num_batched_tokens and the free blocks allow.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        assert max_num_batched_tokens >= max_num_seqs
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> str | None:
        """Queues seq, or returns why it can never run (and then leaves it out)."""
        max_tokens = seq.sampling_params.max_tokens or 1
        total = seq.num_prompt_tokens + max_tokens
        if seq.num_prompt_tokens == 0:
            return "the prompt is empty"
        if total > self.max_model_len:
            return (
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
                f"exceeds max_model_len ({self.max_model_len})"
            )
        if total > self.max_num_batched_tokens:
            return (
                f"prompt + max_tokens = {total} tokens exceeds max_num_batched_tokens "
                f"({self.max_num_batched_tokens}), the most one step can prefill"
            )
        if not self.block_manager.fits_in_pool(total):
            bm = self.block_manager
            return (
                f"prompt + max_tokens = {total} tokens needs {bm.num_blocks_for(total)} KV blocks, "
                f"more than the whole pool ({bm.num_blocks} blocks of {bm.block_size} tokens)"
            )
        self.waiting.append(seq)
        return None

    def schedule(self) -> SchedulerOutput:
        seqs: list[Sequence] = []
        num_new_tokens: list[int] = []
        preempted: list[Sequence] = []
        budget = self.max_num_batched_tokens
        bm = self.block_manager

        running = deque(self.running)
        self.running = []
        while running:
            seq = running.popleft()
            while not bm.can_append_slot(seq):
                victim = running.pop() if running else seq
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                bm.append_slot(seq)
                self.running.append(seq)
                seqs.append(seq)
                num_new_tokens.append(seq.num_tokens - seq.num_computed_tokens)
                budget -= num_new_tokens[-1]

        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_tokens = seq.num_tokens - seq.num_computed_tokens
            if num_tokens > budget or not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seqs.append(seq)
            num_new_tokens.append(num_tokens)
            budget -= num_tokens
        return SchedulerOutput(seqs, num_new_tokens, preempted)

    def finish(self, seq: Sequence) -> None:
        """Returns a finished sequence's blocks at once; seq.status is already FINISHED_*."""
        assert seq.is_finished
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
