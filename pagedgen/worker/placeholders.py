"""Async scheduling's placeholders in a step's input: the tokens the step run last sampled on
the device, which the host has not seen yet (Sequence.PLACEHOLDER)."""

from typing import NamedTuple

import numpy as np
import torch

from pagedgen.core.sequence import PLACEHOLDER, Sequence
from pagedgen.kernels.host_copy import to_device


class LastSamples(NamedTuple):
    """A step's sampled token ids, still on the device, and the sequences that sampled them."""

    token_ids: torch.Tensor
    seqs: list[Sequence]

    def fill(
        self, input_ids: torch.Tensor, placeholders: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        """Writes, on the device, the sampled tokens the host has not seen into input_ids."""
        if placeholders is None:
            return
        indices, sources = to_device(np.stack(placeholders), torch.int64, input_ids.device)
        input_ids[indices] = self.token_ids[sources].to(input_ids.dtype)


def find_placeholders(
    input_ids: np.ndarray,
    seqs: list[Sequence],
    cu_seqlens_q: np.ndarray,
    last: LastSamples | None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(index in input_ids, row of last.token_ids) of each placeholder, or None for none. A
    placeholder is always its sequence's last token, sampled by the step run last."""
    indices = np.flatnonzero(input_ids == PLACEHOLDER)
    if not len(indices):
        return None
    assert last is not None, "a placeholder, but no step sampled it"
    sample_rows = {seq.seq_id: j for j, seq in enumerate(last.seqs)}
    owners = np.searchsorted(cu_seqlens_q, indices, side="right") - 1
    sources = [sample_rows[seqs[i].seq_id] for i in owners.tolist()]
    return indices, np.array(sources, dtype=np.int64)
