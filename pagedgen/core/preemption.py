"""Preempting a running group when blocks run out: swap its blocks out, or free them to
recompute later; plain Python, no torch."""

from enum import Enum

from pagedgen.core.block_manager import BlockManager
from pagedgen.core.block_pool import BlockMapping
from pagedgen.core.sequence import SequenceGroup, SequenceStatus


class PreemptionMode(Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


def preempt(
    group: SequenceGroup,
    block_manager: BlockManager,
    mode: PreemptionMode | None,  # None: swap groups of >1 sequence, recompute the rest
) -> tuple[PreemptionMode, BlockMapping]:
    """Moves a running group's unfinished sequences out of the device pool; returns the mode
    it took and the (device, CPU) block copies a swap needs. A swap the CPU pool has no room
    for becomes a recompute: the sequences go back to waiting with nothing computed."""
    seqs = group.unfinished_seqs
    mode = mode or (PreemptionMode.SWAP if len(group.seqs) > 1 else PreemptionMode.RECOMPUTE)
    mapping = block_manager.swap_out(seqs) if mode == PreemptionMode.SWAP else None
    if mapping is not None:
        for seq in seqs:
            seq.status = SequenceStatus.SWAPPED
        return PreemptionMode.SWAP, mapping
    for seq in seqs:
        block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
    return PreemptionMode.RECOMPUTE, []
