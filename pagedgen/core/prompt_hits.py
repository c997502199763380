"""What an admission finds computed already: each prompt's leading full blocks that the prefix
cache holds, or that an earlier prompt of the same admission writes this step (recomputed
siblings share their prompt again so, with or without a prefix cache); plain Python, no torch."""

from collections.abc import Callable, Hashable
from typing import NamedTuple

from pagedgen.core.block_pool import Block, BlockPool
from pagedgen.core.prefix_hash import block_hashes
from pagedgen.core.sequence import Sequence

# A cached block, or (index in the admission of the prompt that writes it, its block index).
Hit = Block | tuple[int, int]


class PromptHits(NamedTuple):
    seq: Sequence
    hits: list[Hit]
    num_new_tokens: int


def plan_prompt_hits(
    pool: BlockPool,
    block_size: int,
    enable_prefix_caching: bool,
    seqs: list[Sequence],
    num_new_tokens: Callable[[Sequence, int], int],
) -> tuple[list[PromptHits], int] | None:
    """Each prompt's hits, the longest run of its leading full blocks found (always leaving a
    token to compute, so the step yields logits for it; none for a prompt that asks for prompt
    logprobs, as every prompt token's logits must be computed), and what it computes this step,
    num_new_tokens(seq, num_computed_tokens); with the fresh blocks the admission takes, cached
    blocks revived off the free queue included. None when the first prompt computes nothing."""
    written: dict[Hashable, tuple[int, int]] = {}  # full blocks earlier prompts write
    share = enable_prefix_caching or len(seqs) > 1
    revived: set[int] = set()
    plans: list[PromptHits] = []
    needed = 0
    for index, seq in enumerate(seqs):
        hits: list[Hit] = []
        if share and seq.sampling_params.prompt_logprobs is None:
            for block_hash in block_hashes(seq, block_size, (seq.num_tokens - 1) // block_size):
                block = pool.lookup(block_hash) if enable_prefix_caching else None
                if block is None and block_hash not in written:
                    break
                if block is not None and block.ref_count == 0:
                    needed += block.block_id not in revived
                    revived.add(block.block_id)
                hits.append(block if block is not None else written[block_hash])
        num_computed = len(hits) * block_size
        n = num_new_tokens(seq, num_computed)
        if n <= 0 and index == 0:
            return None
        end = num_computed + n
        needed += -(-end // block_size) - len(hits)
        if share:
            new_hashes = block_hashes(seq, block_size, end // block_size)[len(hits) :]
            for i, block_hash in enumerate(new_hashes, start=len(hits)):
                written.setdefault(block_hash, (index, i))
        plans.append(PromptHits(seq, hits, n))
    return plans, needed
