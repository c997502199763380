"""A step's inputs: flattened on the host (StepArrays), then on the device (StepInputs)."""

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from pagedgen.attention import AttentionMetadata
from pagedgen.kernels.host_copy import to_device

if TYPE_CHECKING:
    from pagedgen.core.scheduler_output import SchedulerOutput


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

    def decode_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(block-table row, context length) of every token as a decode row over its causal
        context: a decode graph computes a decode's draft tokens so, as it writes every row's
        K/V before any row's attention reads them."""
        if len(self.input_ids) == len(self.rows):
            return self.rows, self.context_lens
        return np.repeat(self.rows, np.diff(self.cu_seqlens_q)), self.positions + 1

    def to_device(
        self,
        scheduled: "SchedulerOutput",
        tables: np.ndarray,  # BlockTables.table
        block_size: int,
        device: torch.device,
    ) -> "StepInputs":
        """The step's tensors on the device, for an eager forward (placeholders unfilled)."""
        return StepInputs(
            to_device(self.input_ids, torch.int64, device),
            to_device(self.positions, torch.int64, device),
            self.metadata(scheduled, tables, block_size, device),
            self.last_rows,
        )

    def metadata(
        self,
        scheduled: "SchedulerOutput",
        tables: np.ndarray,  # BlockTables.table
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        max_context_len = int(self.context_lens.max())
        block_tables = tables[self.rows, : -(-max_context_len // block_size)]

        def tensor(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return to_device(data, dtype, device)

        return AttentionMetadata(
            slot_mapping=tensor(self.slot_mapping, torch.int64),
            cu_seqlens_q=tensor(self.cu_seqlens_q, torch.int32),
            context_lens=tensor(self.context_lens, torch.int32),
            block_tables=tensor(block_tables, torch.int32),
            max_seqlen_q=max(scheduled.num_new_tokens),
            max_context_len=max_context_len,
            block_size=block_size,
            num_decode_seqs=scheduled.num_decode_seqs,
            query_lens_cpu=list(scheduled.num_new_tokens),
            context_lens_cpu=self.context_lens.tolist(),
            prompt_lens_cpu=[seq.num_prompt_tokens for seq in scheduled.seqs],
        )


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: AttentionMetadata
    last_rows: list[int]  # per scheduled sequence, the row of its last token
