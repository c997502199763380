"""One position's logprobs as the engine carries them, and as vLLM's outputs give them."""

from pagedgen.outputs import Logprob


class TokenLogprobs(dict[int, float]):
    """{the chosen token: its logprob, then the k likeliest tokens' in descending order}, from
    the raw model logits, and the chosen token's rank in the whole vocabulary (1: the likeliest),
    computed on the device, where the k likeliest need not hold it."""

    __slots__ = ("rank",)

    def __init__(self, items: dict[int, float], rank: int) -> None:
        super().__init__(items)
        self.rank = rank

    def __reduce__(self) -> tuple:
        return TokenLogprobs, (dict(self), self.rank)


def as_logprobs(entry: dict[int, float]) -> dict[int, Logprob]:
    """vLLM's form: each token's Logprob, its rank among the entry's by likelihood (exact for
    the k likeliest), the chosen token's the device's where the entry carries it."""
    chosen = next(iter(entry))
    order = sorted(entry, key=lambda token: -entry[token])
    ranks = {token: rank for rank, token in enumerate(order, start=1)}
    if isinstance(entry, TokenLogprobs):
        ranks[chosen] = entry.rank
    return {token: Logprob(entry[token], ranks[token]) for token in entry}
