"""What the sampler needs to know of a step's rows, as tensors on the device: built once per step
by the model runner from the scheduled sequences' parameters and tokens."""

from collections import Counter
from dataclasses import dataclass

import torch

from pagedgen.engine.transfer import to_device
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
        greedy = [p.greedy for p in params]
        num_logprobs = [p.logprobs for p in params]
        requested = [k for k in num_logprobs if k is not None]
        max_num_logprobs = max(requested) if requested else None

        device = torch.device(device)

        def floats(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device)

        def coords(rows: list[int], token_ids: list[int]) -> torch.Tensor:
            return to_device([rows, token_ids], torch.int64, device)

        banned_rows: list[int] = []
        banned_ids: list[int] = []
        for i, p in enumerate(params):
            if len(output_token_ids[i]) < p.min_tokens:
                stop_token_ids = [
                    t for t in p.all_stop_token_ids.union(p.stop_token_ids) if t < vocab_size
                ]
                banned_rows += [i] * len(stop_token_ids)
                banned_ids += stop_token_ids
            output = output_token_ids[i]
            for bad in p.bad_words_token_ids:
                *rest, last = bad
                if (
                    last < vocab_size
                    and len(output) >= len(rest)
                    and (not rest or output[len(output) - len(rest) :] == rest)
                ):
                    banned_rows.append(i)
                    banned_ids.append(last)

        repetition_penalties = repetition_coords = None
        if any(p.repetition_penalty != 1.0 for p in params):
            repetition_penalties = floats([p.repetition_penalty for p in params])
            rows, token_ids = [], []
            for i, p in enumerate(params):
                if p.repetition_penalty != 1.0:
                    seen = prompt_token_ids[i] + output_token_ids[i]
                    rows += [i] * len(seen)
                    token_ids += seen
            repetition_coords = coords(rows, token_ids)

        output_penalty_coords = output_penalties = None
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            rows, token_ids, penalties = [], [], []
            for i, p in enumerate(params):
                if p.presence_penalty or p.frequency_penalty:
                    for token_id, count in Counter(output_token_ids[i]).items():
                        rows.append(i)
                        token_ids.append(token_id)
                        penalties.append(p.presence_penalty + p.frequency_penalty * count)
            output_penalty_coords = coords(rows, token_ids)
            output_penalties = floats(penalties)

        logit_bias_coords = logit_biases = None
        if any(p.logit_bias for p in params):
            rows, token_ids, biases = [], [], []
            for i, p in enumerate(params):
                for token_id, bias in (p.logit_bias or {}).items():
                    rows.append(i)
                    token_ids.append(token_id)
                    biases.append(bias)
            logit_bias_coords = coords(rows, token_ids)
            logit_biases = floats(biases)

        allowed_rows = allowed_coords = None
        if any(p.allowed_token_ids for p in params):
            rows, token_ids, restricted = [], [], []
            for i, p in enumerate(params):
                if p.allowed_token_ids:
                    restricted.append(i)
                    rows += [i] * len(p.allowed_token_ids)
                    token_ids += p.allowed_token_ids
            allowed_rows = to_device(restricted, torch.int64, device)
            allowed_coords = coords(rows, token_ids)

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
            banned_coords=coords(banned_rows, banned_ids) if banned_rows else None,
            logit_bias_coords=logit_bias_coords,
            logit_biases=logit_biases,
            allowed_rows=allowed_rows,
            allowed_coords=allowed_coords,
            num_logprobs=num_logprobs,
            max_num_logprobs=max_num_logprobs,
        )
