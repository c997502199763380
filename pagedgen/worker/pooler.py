"""The torch side of the pooling runner: a step's hidden states pooled into each finished
prompt's embedding, or a classifier's scores."""

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.models.classifier import classifier_activation
from pagedgen.pooling.config import PoolerConfig
from pagedgen.pooling.params import PoolingParams


class PromptChunk(NamedTuple):
    """One scheduled row span of a step: num_tokens prompt tokens of sequence seq_id, from its
    position start on."""

    seq_id: int
    start: int
    num_tokens: int


class PooledPrompt(NamedTuple):
    """A prompt the step completes: row is the hidden row of its last token."""

    seq_id: int
    row: int
    num_prompt_tokens: int
    params: PoolingParams | None


class Pooler:
    """Pools, for each prompt a step completes, the hidden states of its prompt: one float32
    vector on the host per sequence, cut to its PoolingParams.dimensions and then normalized if
    asked. A classifier's (classifier: its
    score head) are the head's logits, turned into scores by activation if asked.

    A prompt computed in several chunks (chunked prefill) is pooled across them: MEAN keeps each
    unfinished prompt's running sum, CLS its first row, until its last chunk. A chunk that starts
    at position 0 starts afresh (a recompute preemption computes the prompt again); a swapped
    prompt keeps what it had. The runner frees a sequence's sum when the sequence dies
    unfinished (free), so an abort leaves none behind.
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
        self._partial: dict[int, torch.Tensor] = {}  # seq_id -> its prompt's sum so far

    @classmethod
    def for_model(cls, config: PoolerConfig, model: nn.Module, hf_config: Any) -> "Pooler":
        """The pooler of a model: a classifier's pools into its score head."""
        if config.task != "classify":
            return cls(config)
        return cls(config, model.score, classifier_activation(hf_config))

    @property
    def accumulates(self) -> bool:
        """Whether it keeps a sum across a prompt's chunks (MEAN, CLS), which free must drop."""
        return self.config.pooling_type != "LAST"

    def free(self, seq_id: int) -> None:
        self._partial.pop(seq_id, None)

    def pool(
        self, hidden: torch.Tensor, chunks: list[PromptChunk], finished: list[PooledPrompt]
    ) -> list[torch.Tensor]:
        """hidden: [num_tokens, hidden_size], the chunks' rows in order. One vector per finished
        prompt, in order."""
        pooling_type = self.config.pooling_type
        if pooling_type != "LAST":
            self._accumulate(hidden, chunks)
        if not finished:
            return []
        if pooling_type == "LAST":
            rows = [prompt.row for prompt in finished]
            pooled = hidden[torch.tensor(rows, device=hidden.device)].float()
        else:
            pooled = torch.stack([self._partial.pop(prompt.seq_id) for prompt in finished])
            if pooling_type == "MEAN":
                lengths = [prompt.num_prompt_tokens for prompt in finished]
                pooled /= torch.tensor(lengths, dtype=pooled.dtype, device=pooled.device)[:, None]
        if self.classifier is not None:
            pooled = self.classifier(pooled.to(hidden.dtype)).float()
        pooled = pooled.cpu()
        vectors = []
        for prompt, vector in zip(finished, pooled):
            params = prompt.params
            if params is not None and params.dimensions is not None:
                vector = vector[: params.dimensions]
            use_activation = params.use_activation if params is not None else None
            if self.config.use_activation if use_activation is None else use_activation:
                vector = self.activation(vector)
            vectors.append(vector)
        return vectors

    def _accumulate(self, hidden: torch.Tensor, chunks: list[PromptChunk]) -> None:
        """Adds each chunk's rows to its sequence's partial result."""
        device = hidden.device
        num_tokens = [chunk.num_tokens for chunk in chunks]
        lengths = torch.tensor(num_tokens, device=device)
        if self.config.pooling_type == "MEAN":
            owner = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
            partial = torch.zeros(len(lengths), hidden.shape[1], device=device)
            partial.index_add_(0, owner, hidden.float())
        else:  # CLS: a chunk's first row, kept where it is the prompt's first token
            first_rows, row = [], 0
            for n in num_tokens:
                first_rows.append(row)
                row += n
            partial = hidden[torch.tensor(first_rows, device=device)].float()
        for chunk, row in zip(chunks, partial):
            if chunk.start == 0:
                self._partial[chunk.seq_id] = row
            elif self.config.pooling_type == "MEAN":
                self._partial[chunk.seq_id] += row
