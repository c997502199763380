from dataclasses import dataclass, field
from typing import Any

from pagedgen.core.block_manager import NULL_BLOCK, BlockManager


@dataclass(slots=True)
class KVUsageTracker:
    """Samples a block manager after every step: how many of the slots its block tables hold
    carry live tokens, and what contiguous allocation would have reserved for the same sequences.

    After a step every running sequence has computed all its tokens but the one just sampled, and
    holds ceil(num_computed_tokens / block_size) blocks, so the only unused slots it holds are
    the tail of its last block (internal fragmentation):

        block_table  [ 7 ][ 2 ][ 9 ]     block_size 4, num_computed_tokens 10
        slots         xxxx xxxx xx..     12 held, 10 live, 2 unused

    Sums run over steps, so a sequence weighs by how long it holds its blocks.
    """

    block_manager: BlockManager
    max_model_len: int
    keep_timeline: bool = False
    num_steps: int = 0
    live_tokens: int = 0  # sum over steps of the tokens whose K/V sit in the pool
    held_blocks: int = 0  # sum over steps of the blocks in all block tables (shared ones twice)
    used_blocks: int = 0  # sum over steps of the physical blocks in use
    num_running: int = 0  # sum over steps of the sequences holding blocks
    reserved_request: int = 0  # sum over steps of min(prompt + max_tokens, max_model_len)
    peak_used_blocks: int = 0
    peak_running: int = 0
    timeline: list[tuple[int, int, int]] = field(default_factory=list)  # (used, held, live)

    def observe(self) -> None:
        bm = self.block_manager
        max_model_len = self.max_model_len
        live = held = reserved = 0
        for seq in bm.seqs.values():
            num_freed = seq.block_table.count(NULL_BLOCK)  # out of a sliding window
            live += seq.num_computed_tokens - num_freed * bm.block_size
            held += len(seq.block_table) - num_freed
            max_tokens = seq.sampling_params.max_tokens or max_model_len
            reserved += min(seq.num_prompt_tokens + max_tokens, max_model_len)
        used = bm.num_used_blocks
        running = len(bm.seqs)
        self.num_steps += 1
        self.live_tokens += live
        self.held_blocks += held
        self.used_blocks += used
        self.num_running += running
        self.reserved_request += reserved
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        self.peak_running = max(self.peak_running, running)
        if self.keep_timeline:
            self.timeline.append((used, held, live))

    def summary(self) -> dict[str, Any]:
        """Utilization, fragmentation and pool usage over the run, paged and contiguous."""
        bm = self.block_manager
        block_size, num_blocks = bm.block_size, bm.num_blocks
        steps = max(self.num_steps, 1)
        held_slots = self.held_blocks * block_size
        pool_tokens = num_blocks * block_size
        mean_running = self.num_running / steps
        paged_slots_per_seq = held_slots / max(self.num_running, 1)
        reserved_per_seq = self.reserved_request / max(self.num_running, 1)
        return {
            "num_steps": self.num_steps,
            "live_token_utilization": _ratio(self.live_tokens, held_slots),
            "internal_fragmentation": _ratio(held_slots - self.live_tokens, held_slots),
            "mean_pool_usage": _ratio(self.used_blocks, steps * num_blocks),
            "peak_pool_usage": _ratio(self.peak_used_blocks, num_blocks),
            "prefix_sharing_savings": _ratio(self.held_blocks - self.used_blocks, self.held_blocks),
            "mean_running": round(mean_running, 2),
            "peak_running": self.peak_running,
            "mean_live_tokens_per_seq": round(self.live_tokens / max(self.num_running, 1), 1),
            "num_sliding_window_freed_blocks": bm.num_sliding_window_freed_blocks,
            "contiguous": [
                {
                    "allocation": "paged",
                    "slots_per_seq": round(paged_slots_per_seq, 1),
                    "live_token_utilization": _ratio(self.live_tokens, held_slots),
                    "num_seqs_that_fit": int(pool_tokens / max(paged_slots_per_seq, 1)),
                },
                {
                    "allocation": "contiguous, prompt + max_tokens",
                    "slots_per_seq": round(reserved_per_seq, 1),
                    "live_token_utilization": _ratio(self.live_tokens, self.reserved_request),
                    "num_seqs_that_fit": int(pool_tokens / max(reserved_per_seq, 1)),
                },
                {
                    "allocation": "contiguous, max_model_len",
                    "slots_per_seq": self.max_model_len,
                    "live_token_utilization": _ratio(
                        self.live_tokens, self.num_running * self.max_model_len
                    ),
                    "num_seqs_that_fit": pool_tokens // self.max_model_len,
                },
            ],
        }


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 4) if denominator else 0.0
