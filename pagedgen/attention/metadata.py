from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step description of a flattened varlen batch, built by the model runner only.

    Sequence i owns query rows cu_seqlens_q[i]:cu_seqlens_q[i+1]; they are the last query_lens[i]
    of its context_lens[i] tokens, so query row j of sequence i sits at position
    context_lens[i] - query_lens[i] + j and attends to positions 0..that position.
    The first num_decode_seqs sequences have exactly one query row each.

    Slots address the cache viewed as [num_blocks * block_size]:
        slot = block_table[pos // block_size] * block_size + pos % block_size
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, every slot valid
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32, cached + new tokens after this step
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32, padded with 0
    max_seqlen_q: int
    max_context_len: int
    block_size: int
    num_decode_seqs: int
    query_lens_cpu: list[int]
    context_lens_cpu: list[int]
    # Per sequence, its prompt's length: query rows at later positions hold sampled tokens
    # (drafts to verify, a recomputed output), which the cpu backend attends to as decode rows,
    # so they come out as the decode steps that made them did. None: all are prompt rows.
    prompt_lens_cpu: list[int] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_cpu)
