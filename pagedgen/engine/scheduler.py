from collections import deque
from enum import Enum
from typing import NamedTuple

from pagedgen.engine.block_manager import BlockManager, BlockMapping
from pagedgen.engine.sequence import Sequence, SequenceGroup, SequenceStatus


class PreemptionMode(Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


class SchedulerOutput(NamedTuple):
    """One step's work. seqs[i] computes its next num_new_tokens[i] tokens; a sequence with 0
    new tokens is a sibling forked this step and samples from the row of the one before it."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    preempted: list[SequenceGroup]
    blocks_to_swap_out: BlockMapping  # device -> CPU, done before anything else
    blocks_to_swap_in: BlockMapping  # CPU -> device
    blocks_to_copy: BlockMapping  # device -> device, copy-on-write

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    """First-come first-served continuous batching over a BlockManager; plain Python, no torch.

    Every step: running groups first, in admission order, each sequence taking its next token
    or its next prefill chunk; when blocks run out, the most recently admitted running group is
    preempted (swapped to the CPU pool, or freed to be recomputed) until the rest fit. Then, if
    nothing was preempted, swapped groups come back in; then, if none is left swapped, waiting
    groups are admitted in arrival order while max_num_seqs, max_num_batched_tokens and the
    free blocks allow.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        preemption_mode: PreemptionMode | None = None,  # None: swap groups of >1, else recompute
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption_mode = preemption_mode
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = {mode: 0 for mode in PreemptionMode}
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def add(self, group: SequenceGroup | Sequence) -> str | None:
        """Queues a group, or returns why it can never run (and then leaves it out)."""
        if isinstance(group, Sequence):
            group = SequenceGroup(group.request_id, group, group.sampling_params)
        seq = group.seqs[0]
        max_tokens = group.sampling_params.max_tokens or 1
        total = seq.num_prompt_tokens + max_tokens
        bm = self.block_manager
        if seq.num_prompt_tokens == 0:
            return "the prompt is empty"
        if total > self.max_model_len:
            return (
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
                f"exceeds max_model_len ({self.max_model_len})"
            )
        if not self.enable_chunked_prefill and total > self.max_num_batched_tokens:
            return (
                f"prompt + max_tokens = {total} tokens exceeds max_num_batched_tokens "
                f"({self.max_num_batched_tokens}), the most one step can prefill"
            )
        # Grown to the end, the group's sequences share only the prompt's full blocks.
        num_shared = seq.num_prompt_tokens // bm.block_size
        needed = num_shared + group.max_num_seqs * (bm.num_blocks_for(total) - num_shared)
        if needed > bm.num_blocks:
            return (
                f"{group.max_num_seqs} x (prompt + max_tokens = {total} tokens) needs {needed} "
                f"KV blocks, more than the whole pool ({bm.num_blocks} of {bm.block_size} tokens)"
            )
        self.waiting.append(group)
        return None

    def schedule(self) -> SchedulerOutput:
        step = _Step(self.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_swapped(step)
        if not self.swapped:
            self._schedule_waiting(step)
        return SchedulerOutput(
            step.seqs,
            step.num_new_tokens,
            step.preempted,
            step.swap_out,
            step.swap_in,
            step.copies,
        )

    def finish(self, seq: Sequence) -> None:
        """Returns a finished sequence's blocks at once; seq.status is already FINISHED_*."""
        assert seq.is_finished
        self.block_manager.free(seq)

    def remove_finished_groups(self) -> None:
        self.running = [group for group in self.running if not group.is_finished]

    def abort(self, group: SequenceGroup) -> None:
        for queue in (self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)
        if group in self.running:
            self.running.remove(group)

    # -- the three queues --------------------------------------------------------------------
    def _schedule_running(self, step: "_Step") -> None:
        bm = self.block_manager
        running = deque(self.running)
        self.running = []
        while running:
            group = running.popleft()
            seqs = group.unfinished_seqs
            num_new = [self._num_new_tokens(seq, step) for seq in seqs]
            if not any(num_new):  # out of token budget: wait for the next step, holding blocks
                self.running.append(group)
                continue
            while not self._can_append(seqs, num_new):
                victim = running.pop() if running else group
                self._preempt(victim, step)
                if victim is group:
                    break
            else:
                for seq, n in zip(seqs, num_new):
                    if n:
                        step.copies += bm.append_slots(seq, n)
                        step.add(seq, n)
                self._fork_samples(group, step)
                self.running.append(group)

    def _schedule_swapped(self, step: "_Step") -> None:
        bm = self.block_manager
        while self.swapped:
            group = self.swapped[0]
            seqs = group.unfinished_seqs
            fits = step.num_seqs(self.running) + len(seqs) <= self.max_num_seqs
            if not fits or step.budget < len(seqs) or not bm.can_swap_in(seqs):
                return
            self.swapped.popleft()
            mapping = bm.swap_in(seqs)
            step.swap_in += mapping
            self.num_blocks_swapped_in += len(mapping)
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
                n = self._num_new_tokens(seq, step)
                step.copies += bm.append_slots(seq, n)
                step.add(seq, n)
            self.running.append(group)

    def _schedule_waiting(self, step: "_Step") -> None:
        bm = self.block_manager
        num_running = step.num_seqs(self.running)
        while self.waiting:
            group = self.waiting[0]
            seqs = group.unfinished_seqs
            num_seqs = len(seqs) + group.num_pending_forks
            if num_running + num_seqs > self.max_num_seqs:
                return
            plans = []
            budget = step.budget
            for seq in seqs:
                cached = bm.find_cached_blocks(seq)
                remaining = seq.num_tokens - len(cached) * bm.block_size
                n = min(remaining, budget) if self.enable_chunked_prefill else remaining
                if n == 0 or n > budget:
                    return
                plans.append((seq, cached, n))
                budget -= n
            if not bm.can_allocate(plans):
                return
            self.waiting.popleft()
            for seq, cached, n in plans:
                bm.allocate(seq, cached, n)
                seq.status = SequenceStatus.RUNNING
                step.add(seq, n)
            self._fork_samples(group, step)
            self.running.append(group)
            num_running += num_seqs

    # -- helpers ---------------------------------------------------------------------------------
    def _num_new_tokens(self, seq: Sequence, step: "_Step") -> int:
        remaining = seq.num_tokens - seq.num_computed_tokens
        return min(remaining, step.budget) if self.enable_chunked_prefill else remaining

    def _can_append(self, seqs: list[Sequence], num_new: list[int]) -> bool:
        bm = self.block_manager
        needed = sum(bm.num_needed_blocks(seq, n) for seq, n in zip(seqs, num_new))
        return needed <= bm.num_free_blocks

    def _fork_samples(self, group: SequenceGroup, step: "_Step") -> None:
        """In the step that completes the prompt, the n - 1 siblings fork off the first sequence
        and sample from its last row, sharing all its blocks."""
        parent = group.seqs[0]
        pending = group.num_pending_forks
        if not pending or parent.num_computed_tokens + step.scheduled(parent) < parent.num_tokens:
            return
        for child in group.fork_samples(parent):
            self.block_manager.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens + step.scheduled(parent)
            step.add(child, 0)

    def _preempt(self, group: SequenceGroup, step: "_Step") -> None:
        bm = self.block_manager
        seqs = group.unfinished_seqs
        mode = self.preemption_mode or (
            PreemptionMode.SWAP if len(group.seqs) > 1 else PreemptionMode.RECOMPUTE
        )
        if mode == PreemptionMode.SWAP and bm.can_swap_out(seqs):
            mapping = bm.swap_out(seqs)
            step.swap_out += mapping
            self.num_blocks_swapped_out += len(mapping)
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(group)
        else:
            mode = PreemptionMode.RECOMPUTE
            for seq in seqs:
                bm.free(seq)
                seq.num_computed_tokens = 0
                seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(group)
        self.num_preemptions[mode] += 1
        step.preempted.append(group)


class _Step:
    """What one schedule() call has decided so far."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.seqs: list[Sequence] = []
        self.num_new_tokens: list[int] = []
        self.preempted: list[SequenceGroup] = []
        self.swap_out: BlockMapping = []
        self.swap_in: BlockMapping = []
        self.copies: BlockMapping = []
        self._scheduled: dict[int, int] = {}

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.budget -= num_new_tokens
        self._scheduled[seq.seq_id] = num_new_tokens

    def scheduled(self, seq: Sequence) -> int:
        return self._scheduled.get(seq.seq_id, 0)

    @staticmethod
    def num_seqs(running: list[SequenceGroup]) -> int:
        return sum(len(group.unfinished_seqs) for group in running)
