from typing import Protocol


class Matcher(Protocol):
    """What a sequence's grammar needs of the grammar engine's matcher (llguidance's LLMatcher)."""

    def consume_tokens(self, token_ids: list[int]) -> bool: ...

    def rollback(self, num_tokens: int) -> bool: ...

    def deep_copy(self) -> "Matcher": ...

    def is_stopped(self) -> bool: ...

    def is_error(self) -> bool: ...

    def get_error(self) -> str: ...


class SequenceGrammar:
    """One sequence's matcher and the output tokens it has consumed.

    Invariant, once sync(seq.output_token_ids) has run: token_ids == seq.output_token_ids, and the
    matcher is in the state those tokens lead to. A sequence's outputs only grow in the engine
    loop; preemption keeps them (recompute) or moves them (swap); only a fork (beam search, n > 1)
    starts from another sequence's tokens, so sync() consumes the new tokens and rolls back,
    rarely, what a fork replaced. An error (a token the grammar refuses, a state that allows no
    token) is final.
    """

    def __init__(self, matcher: Matcher, token_ids: list[int] | None = None) -> None:
        self.matcher = matcher
        self.token_ids = token_ids or []
        self.error: str | None = None

    @property
    def is_terminated(self) -> bool:
        """Whether the constraint is complete and allows no more tokens."""
        return self.error is None and self.matcher.is_stopped()

    def fork(self) -> "SequenceGrammar":
        child = SequenceGrammar(self.matcher.deep_copy(), list(self.token_ids))
        child.error = self.error
        return child

    def sync(self, output_token_ids: list[int]) -> None:
        if self.error is not None:
            return
        num_kept = common_prefix_len(self.token_ids, output_token_ids)
        num_dropped = len(self.token_ids) - num_kept
        if num_dropped:
            del self.token_ids[num_kept:]
            if not self.matcher.rollback(num_dropped):
                self.fail(f"cannot roll the grammar back by {num_dropped} tokens")
                return
        new_token_ids = output_token_ids[num_kept:]
        if new_token_ids:
            self.token_ids.extend(new_token_ids)
            if not self.matcher.consume_tokens(new_token_ids):
                self.fail(f"output token {len(self.token_ids)} does not satisfy the grammar")

    def fail(self, reason: str) -> None:
        """Ends the grammar with an error; the first one stays."""
        if self.error is not None:
            return
        detail = error_text(self.matcher)
        self.error = f"{reason} ({detail})" if detail else reason


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def error_text(matcher: Matcher) -> str:
    """The matcher's error, without the parser state dump llguidance appends to it."""
    if not matcher.is_error():
        return ""
    return matcher.get_error().split("<state>", 1)[0].strip()
