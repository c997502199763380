"""Copies between the host and the device that never make the host wait for the device: inputs
go through pinned memory, and a step's samples come back in one copy the host awaits only when
it needs them, so the host can prepare the next step while the device runs this one."""

import torch

from pagedgen.core.logprobs import TokenLogprobs
from pagedgen.core.runner import SamplerOutput


class PendingSamples:
    """One step's samples, computed on the device: token_ids stay there (the next step's inputs
    under async scheduling), and one non-blocking copy, queued at construction, brings the ids
    and any logprobs to the host. result() waits for that copy alone.

    With logprobs, each row travels packed as float64 (exact for token ids, ranks and float32
    logprobs): [sampled id, its logprob, its rank, top ids (k), top logprobs (k)].
    """

    def __init__(
        self,
        token_ids: torch.Tensor,  # [num_seqs] int64
        logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        # ^ sampled tokens' logprobs and ranks [num_seqs], top-k logprobs and ids [num_seqs, k]
        num_logprobs: list[int | None] | None = None,  # per row; None: the row did not ask
    ) -> None:
        self.token_ids = token_ids
        self.num_logprobs = num_logprobs
        packed = token_ids
        if logprobs is not None:
            sampled, ranks, top_values, top_ids = logprobs
            columns = (token_ids.unsqueeze(1), sampled.unsqueeze(1), ranks.unsqueeze(1))
            columns += (top_ids, top_values)
            packed = torch.cat([c.to(torch.float64) for c in columns], dim=1)
        self._event: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = packed.cpu()

    def result(self) -> SamplerOutput:
        if self._event is not None:
            self._event.synchronize()
        if self.num_logprobs is None:
            return SamplerOutput(self._host.tolist(), None)
        rows = self._host.tolist()
        k = (len(rows[0]) - 3) // 2 if rows else 0
        token_ids, logprobs = [], []
        for row, num_logprobs in zip(rows, self.num_logprobs, strict=True):
            token_id = int(row[0])
            token_ids.append(token_id)
            if num_logprobs is None:
                logprobs.append(None)
                continue
            top = {token_id: row[1]}
            top_ids, top_values = row[3 : 3 + k], row[3 + k :]
            for top_id, value in zip(top_ids[:num_logprobs], top_values[:num_logprobs]):
                top.setdefault(int(top_id), value)
            logprobs.append(TokenLogprobs(top, int(row[2])))
        return SamplerOutput(token_ids, logprobs)
