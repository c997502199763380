"""The prefix cache's keys: a chained hash per full block of a sequence's tokens; no torch."""

from collections.abc import Hashable

from pagedgen.core.sequence import Sequence


def block_hashes(seq: Sequence, block_size: int, num_full_blocks: int) -> list[Hashable]:
    """Extends seq.block_hashes to num_full_blocks: hash i is (hash of block i - 1, tokens),
    block 0's parent None, or ("lora", id) for a LoRA adapter's sequence, whose K/V differ from
    the base model's. Only blocks of known tokens are hashed: none holding a placeholder, none
    holding draft tokens (not in token_ids yet)."""
    num_full_blocks = min(
        num_full_blocks, (seq.num_tokens - seq.num_output_placeholders) // block_size
    )
    hashes = seq.block_hashes
    for i in range(len(hashes), num_full_blocks):
        if hashes:
            parent = hash(hashes[-1])
        else:
            parent = ("lora", seq.lora_int_id) if seq.lora_int_id else None
        hashes.append((parent, tuple(seq.token_ids[i * block_size : (i + 1) * block_size])))
    return hashes[:num_full_blocks]
