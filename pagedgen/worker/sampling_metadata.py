"""What the sampler needs to know of a step's rows, as tensors on the device: built once per step
by the model runner from the scheduled sequences' parameters and tokens."""

from collections import Counter
from dataclasses import dataclass

import torch

from pagedgen.kernels.host_copy import to_device
from pagedgen.sampling_params import SamplingParams

_SEED_MULTIPLIER = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads nearby (seed, step) pairs


def seed_for_step(seed: int, num_output_tokens: int) -> int:
    """The generator seed of a seeded row at this step: a pure function of the request's seed and
    of how many tokens it has generated, so a seeded row samples the same tokens wherever it sits
    and whatever shares its batch."""
    return (seed * _SEED_MULTIPLIER + num_output_tokens) % 2**64


@dataclass(slots=True)
class SamplingMetadata:
    """Per-step sampling inputs for num_seqs rows in batch order, built by the model runner only.

    Every tensor field is None when no row needs it, so an all-greedy batch without penalties or
    logprobs carries no tensors and is sampled with one argmax. Token ids go flat, as coordinates
    into the logits: column j of a [2, n] *_coords tensor is (row, token id).
    """

    num_seqs: int
    all_greedy: bool
    greedy_mask: torch.Tensor | None  # [num_seqs] bool; None when all rows are greedy or random
    temperatures: torch.Tensor | None  # [num_seqs] float32, 1.0 on greedy rows
    top_k: torch.Tensor | None  # [num_seqs] int64, 0 = off
    max_top_k: int  # the largest top_k of a random row, 0 when none has one
    top_p: torch.Tensor | None  # [num_seqs] float32, 1.0 = off
    min_p: torch.Tensor | None  # [num_seqs] float32, 0.0 = off
    seeds: dict[int, int]  # row -> generator seed for this step (random rows only)
    repetition_penalties: torch.Tensor | None  # [num_seqs] float32
    repetition_coords: torch.Tensor | None  # [2, n] int64: each prompt and output token
    output_penalty_coords: torch.Tensor | None  # [2, n] int64: each distinct output token
    output_penalties: torch.Tensor | None  # [n] float32: presence + frequency * count
    # [2, n] int64: tokens to ban, in-vocabulary stop tokens under min_tokens and each bad word's
    # last token where the output ends in the rest of it
    banned_coords: torch.Tensor | None
    logit_bias_coords: torch.Tensor | None  # [2, n] int64: each token a row's logit_bias names
    logit_biases: torch.Tensor | None  # [n] float32: what its logit gets added
    allowed_rows: torch.Tensor | None  # [m] int64: the rows that sample among allowed tokens only
    allowed_coords: torch.Tensor | None  # [2, n] int64: each row's allowed tokens
    num_logprobs: list[int | None]
    max_num_logprobs: int | None  # None when no row asks for logprobs

    @classmethod
    def greedy(cls, num_seqs: int) -> "SamplingMetadata":
        """num_seqs rows that each take the logits' argmax, untouched."""
        return cls(
            num_seqs=num_seqs,
            all_greedy=True,
            greedy_mask=None,
            temperatures=None,
            top_k=None,
            max_top_k=0,
            top_p=None,
            min_p=None,
            seeds={},
            repetition_penalties=None,
            repetition_coords=None,
            output_penalty_coords=None,
            output_penalties=None,
            banned_coords=None,
            logit_bias_coords=None,
            logit_biases=None,
            allowed_rows=None,
            allowed_coords=None,
            num_logprobs=[None] * num_seqs,
            max_num_logprobs=None,
        )

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        device: torch.device | str,
        vocab_size: int,  # the logits' width
    ) -> "SamplingMetadata":
        num_seqs = len(params)
        assert len(prompt_token_ids) == num_seqs == len(output_token_ids)
        if all(p.plain_greedy for p in params):  # most batches: one pass, not a dozen
            return cls.greedy(num_seqs)
        greedy = [p.greedy for p in params]
        num_logprobs = [p.logprobs for p in params]
        requested = [k for k in num_logprobs if k is not None]
        max_num_logprobs = max(requested) if requested else None

        device = torch.device(device)

        def floats(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device)

        def coords(per_row: list[list[int]]) -> torch.Tensor:
            """[2, n]: (row, token id) for each token id of each row's list, in order."""
            rows = [i for i, token_ids in enumerate(per_row) for _ in token_ids]
            return to_device(
                [rows, [t for token_ids in per_row for t in token_ids]], torch.int64, device
            )

        banned: list[list[int]] = [[] for _ in params]
        for i, p in enumerate(params):
            output = output_token_ids[i]
            if len(output) < p.min_tokens:
                stop_ids = p.all_stop_token_ids.union(p.stop_token_ids)
                banned[i] += [t for t in stop_ids if t < vocab_size]
            for bad in p.bad_words_token_ids:
                *rest, last = bad
                if (
                    last < vocab_size
                    and len(output) >= len(rest)
                    and (not rest or output[len(output) - len(rest) :] == rest)
                ):
                    banned[i].append(last)

        repetition_penalties = repetition_coords = None
        if any(p.repetition_penalty != 1.0 for p in params):
            repetition_penalties = floats([p.repetition_penalty for p in params])
            repetition_coords = coords(
                [
                    prompt_token_ids[i] + output_token_ids[i] if p.repetition_penalty != 1.0 else []
                    for i, p in enumerate(params)
                ]
            )

        output_penalty_coords = output_penalties = None
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            counts = [
                Counter(output_token_ids[i]) if p.presence_penalty or p.frequency_penalty else {}
                for i, p in enumerate(params)
            ]
            output_penalty_coords = coords([list(c) for c in counts])
            output_penalties = floats(
                [
                    p.presence_penalty + p.frequency_penalty * n
                    for p, c in zip(params, counts)
                    for n in c.values()
                ]
            )

        logit_bias_coords = logit_biases = None
        if any(p.logit_bias for p in params):
            logit_bias_coords = coords([list(p.logit_bias or ()) for p in params])
            logit_biases = floats([b for p in params for b in (p.logit_bias or {}).values()])

        allowed_rows = allowed_coords = None
        if any(p.allowed_token_ids for p in params):
            restricted = [i for i, p in enumerate(params) if p.allowed_token_ids]
            allowed_rows = to_device(restricted, torch.int64, device)
            allowed_coords = coords([p.allowed_token_ids or [] for p in params])

        all_greedy = all(greedy)
        random_params = [p for p in params if not p.greedy]
        max_top_k = max((p.top_k for p in random_params if p.top_k > 0), default=0)
        return cls(
            num_seqs=num_seqs,
            all_greedy=all_greedy,
            greedy_mask=(
                to_device(greedy, torch.bool, device) if any(greedy) and not all_greedy else None
            ),
            temperatures=(None if all_greedy else floats([p.temperature or 1.0 for p in params])),
            top_k=(
                to_device([p.top_k for p in params], torch.int64, device) if max_top_k else None
            ),
            max_top_k=min(max_top_k, vocab_size),
            top_p=(
                floats([p.top_p for p in params])
                if any(p.top_p < 1.0 for p in random_params)
                else None
            ),
            min_p=(
                floats([p.min_p for p in params]) if any(p.min_p for p in random_params) else None
            ),
            seeds={
                i: seed_for_step(p.seed, len(output_token_ids[i]))
                for i, p in enumerate(params)
                if p.seed is not None and not p.greedy
            },
            repetition_penalties=repetition_penalties,
            repetition_coords=repetition_coords,
            output_penalty_coords=output_penalty_coords,
            output_penalties=output_penalties,
            banned_coords=coords(banned) if any(banned) else None,
            logit_bias_coords=logit_bias_coords,
            logit_biases=logit_biases,
            allowed_rows=allowed_rows,
            allowed_coords=allowed_coords,
            num_logprobs=num_logprobs,
            max_num_logprobs=max_num_logprobs,
        )
