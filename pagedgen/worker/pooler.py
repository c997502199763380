"""The torch side of the pooling runner: a step's hidden states pooled into each finished
prompt's embedding, or a classifier's scores."""

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.models.classifier import classifier_activation
from pagedgen.pooling.config import PoolerConfig


class Pooler:
    """Pools, for each sequence of a step's sample_seqs (those whose prompt the step completes),
    the hidden states of its prompt: one float32 vector on the host per sequence, cut to its
    PoolingParams.dimensions and then normalized if asked. A classifier's (classifier: its
    score head) are the head's logits, turned into scores by activation if asked.

    A prompt computed in several chunks (chunked prefill) is pooled across them: MEAN keeps each
    unfinished prompt's running sum, CLS its first row, until its last chunk. A chunk that starts
    at position 0 starts afresh (a recompute preemption computes the prompt again); a swapped
    prompt keeps what it had. The sums die with their sequences (an abort leaves none behind).
    """

    def __init__(
        self,
        config: PoolerConfig,
        classifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.config = config
        self.classifier = classifier
        self.activation = activation or (lambda vector: F.normalize(vector, dim=-1))
        self._partial: WeakKeyDictionary[Sequence, torch.Tensor] = WeakKeyDictionary()

    @classmethod
    def for_model(cls, config: PoolerConfig, model: nn.Module, hf_config: Any) -> "Pooler":
        """The pooler of a model: a classifier's pools into its score head."""
        if config.task != "classify":
            return cls(config)
        return cls(config, model.score, classifier_activation(hf_config))

    def pool(
        self, hidden: torch.Tensor, scheduled: SchedulerOutput, last_rows: list[int]
    ) -> list[torch.Tensor]:
        pooling_type = self.config.pooling_type
        if pooling_type != "LAST":
            self._accumulate(hidden, scheduled, last_rows)
        seqs = scheduled.sample_seqs
        if not seqs:
            return []
        if pooling_type == "LAST":
            rows = [last_rows[i] for i in scheduled.sample_rows]
            pooled = hidden[torch.tensor(rows, device=hidden.device)].float()
        else:
            pooled = torch.stack([self._partial.pop(seq) for seq in seqs])
            if pooling_type == "MEAN":
                lengths = [seq.num_prompt_tokens for seq in seqs]
                pooled /= torch.tensor(lengths, dtype=pooled.dtype, device=pooled.device)[:, None]
        if self.classifier is not None:
            pooled = self.classifier(pooled.to(hidden.dtype)).float()
        pooled = pooled.cpu()
        vectors = []
        for seq, vector in zip(seqs, pooled):
            params = seq.pooling_params
            if params is not None and params.dimensions is not None:
                vector = vector[: params.dimensions]
            use_activation = params.use_activation if params is not None else None
            if self.config.use_activation if use_activation is None else use_activation:
                vector = self.activation(vector)
            vectors.append(vector)
        return vectors

    def _accumulate(
        self, hidden: torch.Tensor, scheduled: SchedulerOutput, last_rows: list[int]
    ) -> None:
        """Adds each scheduled prompt chunk's rows to its sequence's partial result."""
        device = hidden.device
        lengths = torch.tensor(scheduled.num_new_tokens, device=device)
        if self.config.pooling_type == "MEAN":
            owner = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
            partial = torch.zeros(len(lengths), hidden.shape[1], device=device)
            partial.index_add_(0, owner, hidden.float())
        else:  # CLS: a chunk's first row, kept where it is the prompt's first token
            first_rows = [last - n + 1 for last, n in zip(last_rows, scheduled.num_new_tokens)]
            partial = hidden[torch.tensor(first_rows, device=device)].float()
        for seq, start, row in zip(scheduled.seqs, scheduled.num_computed_tokens, partial):
            if start == 0:
                self._partial[seq] = row
            elif self.config.pooling_type == "MEAN":
                self._partial[seq] += row
