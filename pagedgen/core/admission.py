"""Why a request can never run, checked once when it is queued; plain Python, no torch."""

from pagedgen.core.block_manager import BlockManager
from pagedgen.core.sequence import SequenceGroup


def refusal(
    group: SequenceGroup,
    block_manager: BlockManager,
    max_model_len: int,
    max_prefill_tokens: int | None,  # without chunked prefill, the most one step computes
    max_num_seqs: int,
) -> str | None:
    """The reason group can never run to its max_tokens (or to max_model_len, where its output
    stops as vLLM's does, finish_reason "length"), or None. (Drafts of speculative decoding
    never reach past max_tokens, so they need no room of their own; an embedding request
    computes its prompt only.)"""
    seq = group.seqs[0]
    max_tokens = 0 if seq.pooling_params is not None else group.sampling_params.max_tokens or 1
    total = min(seq.num_prompt_tokens + max_tokens, max_model_len)
    bm = block_manager
    if seq.num_prompt_tokens == 0:
        return "the prompt is empty"
    if seq.num_prompt_tokens > max_model_len:
        return f"prompt ({seq.num_prompt_tokens} tokens) exceeds max_model_len ({max_model_len})"
    if group.sampling_params.n > max_num_seqs:
        return (
            f"n ({group.sampling_params.n}) exceeds max_num_seqs ({max_num_seqs}), the most "
            "sequences that run at once"
        )
    if max_prefill_tokens is not None and total > max_prefill_tokens:
        length = f"prompt + output = {total} tokens" if max_tokens else f"{total} tokens"
        return (
            f"{length} exceeds max_num_batched_tokens ({max_prefill_tokens}), the most one "
            "step can prefill"
        )
    # Grown to the end, the group's sequences share only the prompt's full blocks.
    num_shared = seq.num_prompt_tokens // bm.block_size
    needed = num_shared + group.max_num_seqs * (bm.num_blocks_for(total) - num_shared)
    if needed > bm.num_blocks:
        return (
            f"{group.max_num_seqs} x (prompt + output = {total} tokens) needs {needed} "
            f"KV blocks, more than the whole pool ({bm.num_blocks} of {bm.block_size} tokens)"
        )
    return None
