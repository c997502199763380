"""How many tokens each sequence computes in a step, within the step's token budget; plain
Python, no torch."""

from pagedgen.core.sequence import Sequence


def num_new_tokens(
    seqs: list[Sequence], budget: int, enable_chunked_prefill: bool, num_later: int = 0
) -> list[int]:
    """What each of a running group's seqs computes this step; a decode's drafts leave a token
    of the budget to each sequence after it (num_later more after seqs)."""
    num_new = []
    for i, seq in enumerate(seqs):
        n = seq.num_tokens - seq.num_computed_tokens
        if n == 1 and seq.spec_token_ids:  # a decode and its drafts
            reserved = num_later + len(seqs) - i - 1
            n += max(0, min(len(seq.spec_token_ids), budget - 1 - reserved))
        if n > budget:  # without chunked prefill a sequence's tokens go in one step
            n = budget if enable_chunked_prefill else 0
        num_new.append(n)
        budget -= n
    return num_new


class PromptBudget:
    """BlockManager.allocate_prompt's num_new_tokens for one waiting group: each prompt's
    tokens past its cached prefix, as many as the budget left allows (all or none without
    chunked prefill), spent as they are handed out."""

    def __init__(self, budget: int, enable_chunked_prefill: bool) -> None:
        self.budget = budget
        self.enable_chunked_prefill = enable_chunked_prefill

    def __call__(self, seq: Sequence, num_computed_tokens: int) -> int:
        remaining = seq.num_tokens - num_computed_tokens
        n = min(remaining, self.budget) if self.enable_chunked_prefill else remaining
        if n > self.budget:
            return 0
        self.budget -= n
        return n
