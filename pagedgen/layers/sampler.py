from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from pagedgen.engine.runner import SamplerOutput
from pagedgen.engine.transfer import PendingSamples, to_device
from pagedgen.sampling_params import SamplingParams

_SEED_MULTIPLIER = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads nearby (seed, step) pairs
NUM_TOP_P_CANDIDATES = 1024  # top_p looks for its nucleus among these first, sorting only those


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
    min_tokens_coords: torch.Tensor | None  # [2, n] int64: in-vocabulary stop tokens to mask
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

        min_tokens_rows: list[int] = []
        min_tokens_ids: list[int] = []
        for i, p in enumerate(params):
            if len(output_token_ids[i]) < p.min_tokens:
                stop_token_ids = [
                    t for t in p.all_stop_token_ids.union(p.stop_token_ids) if t < vocab_size
                ]
                min_tokens_rows += [i] * len(stop_token_ids)
                min_tokens_ids += stop_token_ids

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
            min_tokens_coords=coords(min_tokens_rows, min_tokens_ids) if min_tokens_rows else None,
            num_logprobs=num_logprobs,
            max_num_logprobs=max_num_logprobs,
        )


class Sampler(nn.Module):
    """Picks one token per row. Order, as in vLLM V1: raw logprobs, min_tokens, penalties; greedy
    rows take the argmax there; random rows go on through temperature, min_p, top_k, top_p and
    an exponential race (argmax of probs / Exponential(1)), seeded per row where asked, else
    drawn from generator (the engine's own; None: torch's global one)."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = generator

    def forward(
        self,
        logits: torch.Tensor,  # [num_seqs, vocab_size]
        metadata: SamplingMetadata,
    ) -> SamplerOutput:
        return self.sample(logits, metadata).result()

    def sample(
        self,
        logits: torch.Tensor,  # [num_seqs, vocab_size]
        metadata: SamplingMetadata,
    ) -> PendingSamples:
        """forward, leaving the samples on the device with their copy to the host queued."""
        md = metadata
        assert logits.dim() == 2 and logits.shape[0] == md.num_seqs, logits.shape
        edits_in_place = not (
            md.min_tokens_coords is None
            and md.repetition_coords is None
            and md.output_penalty_coords is None
        )
        logits = logits.to(torch.float32, copy=edits_in_place)
        raw_logprobs = None if md.max_num_logprobs is None else logits.log_softmax(dim=-1)
        apply_min_tokens_(logits, md)
        apply_penalties_(logits, md)
        token_ids = logits.argmax(dim=-1) if md.all_greedy else self._sample_random(logits, md)
        if raw_logprobs is None:
            return PendingSamples(token_ids)
        logprobs = gather_logprobs(raw_logprobs, token_ids, md.max_num_logprobs)
        return PendingSamples(token_ids, logprobs, md.num_logprobs)

    def _sample_random(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        greedy_token_ids = logits.argmax(dim=-1) if md.greedy_mask is not None else None
        assert md.temperatures is not None
        logits = logits / md.temperatures.unsqueeze(1)
        logits = apply_min_p(logits, md.min_p)
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p, md.max_top_k)
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs)
        if len(md.seeds) < md.num_seqs:
            q.exponential_(generator=self.generator)
        for row, seed in md.seeds.items():
            q[row].exponential_(generator=torch.Generator(probs.device).manual_seed(seed))
        # A zero draw would turn a masked (zero) probability into 0/0 = nan, which argmax picks.
        q.clamp_(min=torch.finfo(q.dtype).tiny)
        token_ids = probs.div_(q).argmax(dim=-1)
        if greedy_token_ids is not None:
            token_ids = torch.where(md.greedy_mask, greedy_token_ids, token_ids)
        return token_ids


def apply_min_tokens_(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Bans, in place, the stop tokens of rows that have generated fewer than min_tokens."""
    if md.min_tokens_coords is not None:
        rows, token_ids = md.min_tokens_coords
        logits[rows, token_ids] = float("-inf")


def apply_penalties_(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Applies in place the repetition penalty over prompt + output tokens (divide positive
    logits, multiply negative ones, as in HF and vLLM), then the presence and frequency penalties
    over output tokens only. Touches only the listed (row, token) entries."""
    if md.repetition_coords is not None:
        assert md.repetition_penalties is not None
        rows, token_ids = md.repetition_coords
        seen = logits[rows, token_ids]
        penalties = md.repetition_penalties[rows]
        # A token listed twice gets the same value twice: the write needs no deduplication.
        penalized = torch.where(seen > 0, seen / penalties, seen * penalties)
        logits.index_put_((rows, token_ids), penalized)
    if md.output_penalty_coords is not None:
        assert md.output_penalties is not None
        rows, token_ids = md.output_penalty_coords
        logits.index_put_((rows, token_ids), -md.output_penalties, accumulate=True)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor | None) -> torch.Tensor:
    """Bans tokens whose probability is below min_p times the row's highest probability."""
    if min_p is None:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor,  # [num_seqs, vocab_size]
    top_k: torch.Tensor | None,  # [num_seqs] int64, 0 = off
    top_p: torch.Tensor | None,  # [num_seqs] float32, 1.0 = off
    max_top_k: int,  # max(top_k) over the rows that have one, at most vocab_size; 0 if none
) -> torch.Tensor:
    """Keeps the top_k highest logits (ties with the k-th too), then the smallest set of most
    likely tokens whose probability, renormalized over the top k, reaches top_p; at least one
    token always survives. Same result as apply_top_k_top_p_sorted. On the CPU, without a full
    sort unless some row's nucleus reaches past the NUM_TOP_P_CANDIDATES most likely tokens; on a
    GPU, by the full sort, since finding that out would make the host wait for the device."""
    vocab_size = logits.shape[1]
    k = torch.full_like(logits[:, 0], vocab_size, dtype=torch.int64) if top_k is None else top_k
    k = torch.where((k <= 0) | (k > vocab_size), vocab_size, k)
    if top_p is None:
        if top_k is None:
            return logits
        kth = logits.topk(max_top_k, dim=-1).values.gather(1, (k.clamp(max=max_top_k) - 1)[:, None])
        kth.masked_fill_((k > max_top_k)[:, None], float("-inf"))  # rows without top_k
        return logits.masked_fill(logits < kth, float("-inf"))
    if logits.device.type != "cpu":
        return apply_top_k_top_p_sorted(logits, k, top_p)
    has_k = k < vocab_size
    num_candidates = min(vocab_size, max(NUM_TOP_P_CANDIDATES, max_top_k))
    values, ids = logits.topk(num_candidates, dim=-1)  # descending
    kth = values.gather(1, (k.clamp(max=num_candidates) - 1).unsqueeze(1))
    values = values.masked_fill(values < kth, float("-inf"))
    # A row with top_k has its whole top-k set among the candidates; one without normalizes over
    # the whole vocabulary, and if its candidates hold top_p of the mass, the rest is cut anyway.
    log_z = torch.where(has_k, values.logsumexp(dim=-1), logits.logsumexp(dim=-1))
    probs = (values - log_z.unsqueeze(1)).exp()
    cum_probs = probs.cumsum(dim=-1)
    unfiltered = ~has_k & (top_p >= 1)
    if not bool((has_k | unfiltered | (cum_probs[:, -1] >= top_p)).all()):
        return apply_top_k_top_p_sorted(logits, k, top_p)
    drop = (cum_probs - probs >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    values = values.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(logits, float("-inf")).scatter_(1, ids, values)
    return torch.where(unfiltered.unsqueeze(1), logits, filtered)


def apply_top_k_top_p_sorted(
    logits: torch.Tensor,  # [num_seqs, vocab_size]
    k: torch.Tensor,  # [num_seqs] int64 in [1, vocab_size]
    top_p: torch.Tensor,  # [num_seqs] float32
) -> torch.Tensor:
    """apply_top_k_top_p by a full sort of each row: the reference and the fallback."""
    vocab_size = logits.shape[1]
    sorted_logits, sorted_ids = logits.sort(dim=-1)  # ascending
    kth = sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    # Ascending cumsum: a token goes when the tokens at least as unlikely hold <= 1 - top_p,
    # i.e. when the strictly more likely ones already reach top_p.
    cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum_probs <= 1 - top_p.unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)


def gather_logprobs(
    raw_logprobs: torch.Tensor,  # [num_seqs, vocab_size], log_softmax of the raw logits
    token_ids: torch.Tensor,  # [num_seqs] int64, the sampled tokens
    max_num_logprobs: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device: the sampled tokens' logprobs [num_seqs], and the top max_num_logprobs
    logprobs and their ids [num_seqs, k], highest first."""
    sampled = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    k = min(max_num_logprobs, raw_logprobs.shape[1])
    top = raw_logprobs.topk(k, dim=-1)
    return sampled, top.values, top.indices
