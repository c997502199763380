import torch
from torch import nn

from pagedgen.core.runner import SamplerOutput
from pagedgen.kernels import cpu_ops
from pagedgen.worker.sampling_metadata import SamplingMetadata
from pagedgen.worker.transfer import PendingSamples

NUM_TOP_P_CANDIDATES = 1024  # top_p looks for its nucleus among these first, sorting only those


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1); on the CPU by our C op (torch's runs one row at a time, ~14 GB/s)."""
    if cpu_ops.usable(logits) and logits.stride(1) == 1:
        return cpu_ops.argmax(logits)
    return logits.argmax(dim=-1)


class Sampler(nn.Module):
    """Picks one token per row. Order, as in vLLM V1: raw logprobs, allowed_token_ids, bad
    words and min_tokens, logit_bias, penalties; greedy
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
            md.banned_coords is None
            and md.allowed_coords is None
            and md.logit_bias_coords is None
            and md.repetition_coords is None
            and md.output_penalty_coords is None
        )
        if md.all_greedy and not edits_in_place and md.max_num_logprobs is None:
            # widening is exact, so the argmax of the model's dtype is the float32 one's
            return PendingSamples(_argmax(logits))
        logits = logits.to(torch.float32, copy=edits_in_place)
        raw_logprobs = None if md.max_num_logprobs is None else logits.log_softmax(dim=-1)
        apply_allowed_token_ids_(logits, md)
        apply_bans_(logits, md)
        apply_logit_bias_(logits, md)
        apply_penalties_(logits, md)
        token_ids = _argmax(logits) if md.all_greedy else self._sample_random(logits, md)
        if raw_logprobs is None:
            return PendingSamples(token_ids)
        logprobs = gather_logprobs(raw_logprobs, token_ids, md.max_num_logprobs)
        return PendingSamples(token_ids, logprobs, md.num_logprobs)

    def _sample_random(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        greedy_token_ids = _argmax(logits) if md.greedy_mask is not None else None
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


def apply_bans_(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Bans, in place, the stop tokens of rows that have generated fewer than min_tokens and the
    tokens that would complete a bad word."""
    if md.banned_coords is not None:
        rows, token_ids = md.banned_coords
        # One fill at flat offsets: on a GPU, logits[rows, token_ids] = -inf waits for the device.
        if logits.is_contiguous():
            logits.view(-1).index_fill_(0, rows * logits.shape[1] + token_ids, float("-inf"))
        else:
            logits[rows, token_ids] = float("-inf")


def apply_allowed_token_ids_(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Bans, in place, every token but its allowed ones from each restricted row."""
    if md.allowed_coords is not None:
        rows, token_ids = md.allowed_coords
        kept = logits[rows, token_ids]
        logits[md.allowed_rows] = float("-inf")
        logits[rows, token_ids] = kept


def apply_logit_bias_(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Adds, in place, each row's logit_bias to the logits of the tokens it names."""
    if md.logit_bias_coords is not None:
        assert md.logit_biases is not None
        rows, token_ids = md.logit_bias_coords
        logits.index_put_((rows, token_ids), md.logit_biases, accumulate=True)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device: the sampled tokens' logprobs and ranks [num_seqs], and the top
    max_num_logprobs logprobs and their ids [num_seqs, k], highest first."""
    sampled = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    k = min(max_num_logprobs, raw_logprobs.shape[1])
    top = raw_logprobs.topk(k, dim=-1)
    return sampled, token_ranks(raw_logprobs, sampled), top.values, top.indices


def token_ranks(logprobs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each row's rank of its chosen token (1: none likelier), as vLLM ranks it."""
    return (logprobs > chosen.unsqueeze(1)).sum(dim=1) + 1
