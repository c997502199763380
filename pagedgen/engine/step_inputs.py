"""A step's inputs: flattened on the host (StepArrays), then on the device (StepInputs)."""

from typing import NamedTuple

import numpy as np
import torch

from pagedgen.attention import AttentionMetadata


class StepArrays(NamedTuple):
    """A step's inputs on the host, flattened: one entry per token, or per sequence."""

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    context_lens: np.ndarray  # [num_seqs] int64
    cu_seqlens_q: np.ndarray  # [num_seqs + 1] int64
    rows: np.ndarray  # [num_seqs]: each sequence's row of BlockTables.table
    # Where input_ids holds a PLACEHOLDER: (its index in input_ids, the row of the previous
    # step's samples that holds its token); None when every input token is known.
    placeholders: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def last_rows(self) -> list[int]:
        return (self.cu_seqlens_q[1:] - 1).tolist()


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: AttentionMetadata
    last_rows: list[int]  # per scheduled sequence, the row of its last token
