from typing import TYPE_CHECKING, NamedTuple

from pagedgen.core.block_manager import BlockMapping
from pagedgen.core.sequence import Sequence, SequenceGroup

if TYPE_CHECKING:
    from pagedgen.engine.structured_output.manager import GrammarBitmask


class SchedulerOutput(NamedTuple):
    """One step's work, decided and already counted as done by the scheduler.

    seqs[i] computes token_ids[num_computed_tokens[i] : num_computed_tokens[i] + num_new_tokens[i]]
    (num_computed_tokens as it was before this step); the first num_decode_seqs compute one token
    each, their last. After the step, sample_seqs[j] samples its next token from the logits of
    the last token of seqs[sample_rows[j]]: its own, or its parent's for a sibling forked this
    step (which computes nothing). A sequence in spec_token_ids (by seq_id) computes its draft
    tokens after its last one (they are not in its token_ids) and samples from the logits of each
    of them too: 1 + len(drafts) samples, in position order, in place of one. grammar_bitmask,
    set by the engine, holds the allowed tokens of the sample rows that have a structured output
    constraint (which draft none).
    """

    seqs: list[Sequence]
    num_computed_tokens: list[int]
    num_new_tokens: list[int]
    num_decode_seqs: int
    sample_seqs: list[Sequence]
    sample_rows: list[int]
    preempted: list[SequenceGroup]
    blocks_to_swap_out: BlockMapping  # device -> CPU, done before anything else
    blocks_to_swap_in: BlockMapping  # CPU -> device
    blocks_to_copy: BlockMapping  # device -> device, copy-on-write
    spec_token_ids: dict[int, list[int]]  # seq_id -> its draft tokens; empty: no drafts
    grammar_bitmask: "GrammarBitmask | None" = None

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens computed by prefill rows: prompts, and outputs recomputed after a preemption
        (not a decode's last token and drafts, though they share the prefill rows' layout)."""
        num_spec = sum(1 + len(drafts) for drafts in self.spec_token_ids.values())
        return sum(self.num_new_tokens[self.num_decode_seqs :]) - num_spec

    @property
    def sample_row_seqs(self) -> list[Sequence]:
        """The sequence of each sample row: sample_seqs, each repeated for its drafts."""
        if not self.spec_token_ids:
            return self.sample_seqs
        spec = self.spec_token_ids
        return [s for seq in self.sample_seqs for s in [seq] * (1 + len(spec.get(seq.seq_id, ())))]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class ScheduledStep:
    """What one Scheduler.schedule() call has decided so far."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.seqs: list[Sequence] = []
        self.starts: list[int] = []  # num_computed_tokens before the step
        self.num_new_tokens: list[int] = []
        self.num_decode_seqs = 0
        self.forks: list[tuple[Sequence, Sequence]] = []  # (parent, child) forked this step
        # (seq, index in seqs of the seq whose last row it samples), in the order scheduled
        self.samplers: list[tuple[Sequence, int]] = []
        self.preempted: list[SequenceGroup] = []
        self.swap_out: BlockMapping = []
        self.swap_in: BlockMapping = []
        self.copies: BlockMapping = []
        self.spec: dict[int, list[int]] = {}  # seq_id -> draft tokens scheduled
        self._index: dict[int, int] = {}  # seq_id -> index in seqs
        self._decode_after_prefill = False  # then output() must move the decodes first

    def add(self, seq: Sequence, num_computed_tokens: int, num_new_tokens: int) -> None:
        index = len(self.seqs)
        self.seqs.append(seq)
        self.starts.append(num_computed_tokens)
        self.num_new_tokens.append(num_new_tokens)
        self.budget -= num_new_tokens
        self._index[seq.seq_id] = index
        num_drafts = num_computed_tokens + num_new_tokens - seq.num_tokens
        if num_drafts >= 0:
            self.samplers.append((seq, index))
            if num_drafts:
                seq.spec_token_ids = self.spec[seq.seq_id] = seq.spec_token_ids[:num_drafts]
            if num_new_tokens == 1:  # a decode, as is_decode(index)
                self._decode_after_prefill |= self.num_decode_seqs < index
                self.num_decode_seqs += 1

    def add_decode(self, seq: Sequence) -> None:
        """add(seq, seq.num_computed_tokens, 1) for a sequence with one token to compute and no
        drafts: the decode steps' hot path, without add's arithmetic."""
        index = len(self.seqs)
        self.seqs.append(seq)
        self.starts.append(seq.num_computed_tokens)
        self.num_new_tokens.append(1)
        self.budget -= 1
        self._index[seq.seq_id] = index
        self.samplers.append((seq, index))
        if self.num_decode_seqs < index:
            self._decode_after_prefill = True
        self.num_decode_seqs += 1

    def add_fork(self, parent: Sequence, child: Sequence) -> None:
        """child, forked off parent (scheduled this step), samples from parent's last row."""
        self.forks.append((parent, child))
        self.samplers.append((child, self._index[parent.seq_id]))

    def end(self, seq: Sequence) -> int:
        """How many of seq's tokens are computed once this step has run."""
        index = self._index.get(seq.seq_id)
        if index is None:
            return seq.num_computed_tokens
        return self.starts[index] + self.num_new_tokens[index]

    def is_decode(self, i: int) -> bool:
        return self.num_new_tokens[i] == 1 and self.starts[i] + 1 == self.seqs[i].num_tokens

    @staticmethod
    def num_seqs(running: list[SequenceGroup]) -> int:
        return sum(len(group.unfinished_seqs) for group in running)

    def output(self) -> SchedulerOutput:
        """The step laid out for the runner: decodes first, then prefill chunks, each in the
        order scheduled."""
        seqs, starts, num_new_tokens = self.seqs, self.starts, self.num_new_tokens
        row_of: list[int] | range = range(len(seqs))  # index in seqs -> row
        if self._decode_after_prefill:
            order = sorted(range(len(seqs)), key=lambda i: not self.is_decode(i))
            seqs = [seqs[i] for i in order]
            starts = [starts[i] for i in order]
            num_new_tokens = [num_new_tokens[i] for i in order]
            row_of = [0] * len(order)
            for row, i in enumerate(order):
                row_of[i] = row
        return SchedulerOutput(
            seqs=seqs,
            num_computed_tokens=starts,
            num_new_tokens=num_new_tokens,
            num_decode_seqs=self.num_decode_seqs,
            sample_seqs=[seq for seq, _ in self.samplers],
            sample_rows=[row_of[i] for _, i in self.samplers],
            preempted=self.preempted,
            blocks_to_swap_out=self.swap_out,
            blocks_to_swap_in=self.swap_in,
            blocks_to_copy=self.copies,
            spec_token_ids=self.spec,
        )
