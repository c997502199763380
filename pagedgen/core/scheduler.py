from collections import deque
from itertools import count

from pagedgen.core.admission import refusal
from pagedgen.core.block_manager import BlockManager
from pagedgen.core.preemption import PreemptionMode, preempt
from pagedgen.core.scheduler_output import ScheduledStep, SchedulerOutput
from pagedgen.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedgen.core.token_budget import PromptBudget, num_new_tokens
from pagedgen.sampling_params import SamplingParams


class RunningLoRAs:
    """The LoRA adapters the running groups use, which a step's slots must hold: at most
    max_loras of them (None: LoRA is off, anything goes)."""

    def __init__(self, max_loras: int | None, running: list[SequenceGroup]) -> None:
        self.max_loras = max_loras
        self.ids = set() if max_loras is None else {g.lora_int_id for g in running} - {0}

    def admits(self, group: SequenceGroup) -> bool:
        """Whether group may join without one adapter too many."""
        lora_id = group.lora_int_id
        if not lora_id or self.max_loras is None or lora_id in self.ids:
            return True
        return len(self.ids) < self.max_loras

    def add(self, group: SequenceGroup) -> None:
        if group.lora_int_id and self.max_loras is not None:
            self.ids.add(group.lora_int_id)


class Scheduler:
    """First-come first-served continuous batching over a BlockManager; plain Python, no torch.

    Every step: running groups first, in admission order, each sequence taking its next token
    or its next prefill chunk; when blocks run out, the most recently admitted running group is
    preempted (swapped to the CPU pool, or freed to be recomputed) until the rest fit. Then, if
    nothing was preempted, swapped groups come back in; then, if none is left swapped, waiting
    groups are admitted in arrival order while max_num_seqs, max_num_batched_tokens and the
    free blocks allow. With max_loras, the running groups use at most that many LoRA adapters:
    a waiting group that would add one more waits while those behind it go ahead, as in vLLM.
    (Swapped groups need no such check: nothing is admitted while one is swapped, so their
    adapters are among those that were running with them.)

    The scheduler is the one owner of step progress: schedule() counts the tokens it schedules
    as computed (_update_after_schedule) and decides which sequences sample; the engine runs
    the step and appends the samples; drafts (spec_token_ids) go after a decode's last token,
    as the budget allows, until the engine rejects some (reject_drafts). It also hands out
    sequence ids, and forks and finishes sequences for the engine and beam search.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        preemption_mode: PreemptionMode | None = None,  # None: swap groups of >1, else recompute
        max_loras: int | None = None,  # distinct LoRA adapters running at once; None: no LoRA
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption_mode = preemption_mode
        self.max_loras = max_loras
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = {mode: 0 for mode in PreemptionMode}
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self._seq_ids = count()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def new_sequence(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        lora_int_id: int = 0,
    ) -> Sequence:
        return Sequence(
            next(self._seq_ids),
            request_id,
            prompt_token_ids,
            sampling_params,
            arrival_time,
            lora_int_id,
        )

    def add(self, group: SequenceGroup) -> str | None:
        """Queues a group, or returns why it can never run (and then leaves it out)."""
        error = refusal(
            group,
            self.block_manager,
            self.max_model_len,
            None if self.enable_chunked_prefill else self.max_num_batched_tokens,
            self.max_num_seqs,
        )
        if error is None:
            self.waiting.append(group)
        return error

    def schedule(self) -> SchedulerOutput:
        step = ScheduledStep(self.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_swapped(step)
        if not self.swapped:
            self._schedule_waiting(step)
        return self._update_after_schedule(step)

    def fork(self, parent: Sequence) -> Sequence:
        """A running sequence's copy sharing all its blocks (beam search keeps both)."""
        child = parent.fork(next(self._seq_ids))
        self.block_manager.fork(parent, child)
        return child

    def finish(self, seq: Sequence) -> None:
        """Returns a finished sequence's blocks at once; seq.status is already FINISHED_*."""
        assert seq.is_finished
        self.block_manager.free(seq)

    def remove_finished_groups(self, queued: bool = False) -> None:
        """Drops finished groups from running; with queued, from waiting and swapped too (under
        async scheduling, a group preempted before its last token arrived finishes there)."""
        self.running = [group for group in self.running if not group.is_finished]
        if queued:
            self.waiting = deque(group for group in self.waiting if not group.is_finished)
            self.swapped = deque(group for group in self.swapped if not group.is_finished)

    def abort(self, group: SequenceGroup) -> None:
        for queue in (self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)
        if group in self.running:
            self.running.remove(group)

    # -- the three queues --------------------------------------------------------------------
    def _schedule_running(self, step: ScheduledStep) -> None:
        bm = self.block_manager
        running = deque(self.running)
        self.running = []
        keep, schedule_decode = self.running.append, self._schedule_decode
        num_later = len(bm.seqs)  # running sequences after this group (all hold blocks)
        while running:
            group = running.popleft()
            seqs = group.unfinished_seqs
            num_later -= len(seqs)
            if len(seqs) == 1 and not group.num_pending_forks and schedule_decode(seqs[0], step):
                keep(group)
                continue
            num_new = num_new_tokens(seqs, step.budget, self.enable_chunked_prefill, num_later)
            if not any(num_new):  # out of token budget: wait for the next step, holding blocks
                self.running.append(group)
                continue
            copies = bm.allocate_slots(seqs, num_new)
            while copies is None:
                victim = running.pop() if running else group
                self._preempt(victim, step)
                if victim is group:
                    break
                copies = bm.allocate_slots(seqs, num_new)
            if copies is None:
                continue
            step.copies += copies
            for seq, n in zip(seqs, num_new):
                if n:
                    step.add(seq, seq.num_computed_tokens, n)
            if group.num_pending_forks:
                self._fork_samples(group, step)
            self.running.append(group)

    def _schedule_decode(self, seq: Sequence, step: ScheduledStep) -> bool:
        """The fast path of a group of one sequence, all its samples forked, that computes one
        token with no drafts: schedules it, and returns True, where the general path would do
        just that, without a copy."""
        if (
            len(seq.token_ids) - seq.num_computed_tokens != 1
            or seq.spec_token_ids
            or step.budget < 1
        ):
            return False
        if not self.block_manager.append_decode(seq):
            return False
        step.add_decode(seq)
        return True

    def _schedule_swapped(self, step: ScheduledStep) -> None:
        while self.swapped:
            group = self.swapped[0]
            seqs = group.unfinished_seqs
            if step.num_seqs(self.running) + len(seqs) > self.max_num_seqs:
                return
            num_new = num_new_tokens(seqs, step.budget, self.enable_chunked_prefill)
            if not all(num_new):
                return
            swapped_in = self.block_manager.swap_in(seqs, num_new)
            if swapped_in is None:
                return
            mapping, copies = swapped_in
            self.swapped.popleft()
            step.swap_in += mapping
            step.copies += copies
            self.num_blocks_swapped_in += len(mapping)
            for seq, n in zip(seqs, num_new):
                seq.status = SequenceStatus.RUNNING
                step.add(seq, seq.num_computed_tokens, n)
            self.running.append(group)

    def _schedule_waiting(self, step: ScheduledStep) -> None:
        if not self.waiting:
            return
        loras = RunningLoRAs(self.max_loras, self.running)
        held: list[SequenceGroup] = []  # their adapter would be one too many: they keep their place
        try:
            self._admit_waiting(step, loras, held)
        finally:
            self.waiting.extendleft(reversed(held))

    def _admit_waiting(
        self, step: ScheduledStep, loras: RunningLoRAs, held: list[SequenceGroup]
    ) -> None:
        num_running = step.num_seqs(self.running)
        while self.waiting:
            group = self.waiting[0]
            if not loras.admits(group):
                held.append(self.waiting.popleft())
                continue
            seqs = group.unfinished_seqs
            num_seqs = len(seqs) + group.num_pending_forks
            if num_running + num_seqs > self.max_num_seqs:
                return
            budget = PromptBudget(step.budget, self.enable_chunked_prefill)
            plans = self.block_manager.allocate_prompt(seqs, budget)
            if plans is None:
                return
            self.waiting.popleft()
            if group.num_cached_tokens is None:
                group.num_cached_tokens = plans[0].num_computed_tokens
            for seq, plan in zip(seqs, plans):
                seq.status = SequenceStatus.RUNNING
                if plan.num_new_tokens:
                    step.add(seq, plan.num_computed_tokens, plan.num_new_tokens)
                else:  # its shared prefix counts as computed; the rest comes in later steps
                    seq.num_computed_tokens = plan.num_computed_tokens
            self._fork_samples(group, step)
            self.running.append(group)
            num_running += num_seqs
            loras.add(group)

    # -- helpers ---------------------------------------------------------------------------------
    def _fork_samples(self, group: SequenceGroup, step: ScheduledStep) -> None:
        """In the step that completes the prompt, the n - 1 siblings fork off the first sequence
        and sample from its last row, sharing all its blocks."""
        parent = group.seqs[0]
        if not group.num_pending_forks or step.end(parent) < parent.num_tokens:
            return
        for child in group.fork_samples(parent, self._seq_ids):
            self.block_manager.fork(parent, child)
            step.add_fork(parent, child)

    def _preempt(self, group: SequenceGroup, step: ScheduledStep) -> None:
        mode, mapping = preempt(group, self.block_manager, self.preemption_mode)
        if mode == PreemptionMode.SWAP:
            step.swap_out += mapping
            self.num_blocks_swapped_out += len(mapping)
            self.swapped.appendleft(group)
        else:
            self.waiting.appendleft(group)
        self.num_preemptions[mode] += 1
        step.preempted.append(group)

    def reject_drafts(self, seq: Sequence, num_rejected: int) -> None:
        """Uncounts the K/V of the drafts sampling turned down, and frees the blocks past
        seq's tokens (the next step overwrites the other slots)."""
        seq.num_computed_tokens -= num_rejected
        self.block_manager.free_past_tokens(seq)

    def _update_after_schedule(self, step: ScheduledStep) -> SchedulerOutput:
        """Counts the step's tokens as computed: the one place progress advances."""
        for seq, start, n in zip(step.seqs, step.starts, step.num_new_tokens):
            seq.num_computed_tokens = start + n
        for parent, child in step.forks:
            child.num_computed_tokens = parent.num_computed_tokens
        return step.output()
