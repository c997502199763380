from array import array
from weakref import WeakKeyDictionary

from pagedgen.core.sequence import Sequence
from pagedgen.spec_decode.config import SpeculativeConfig


class NgramProposer:
    """Proposes draft tokens by prompt lookup (vLLM's NgramProposer): the tokens that followed
    the latest earlier occurrence of the longest suffix n-gram, prompt_lookup_max >= n >=
    prompt_lookup_min, of the sequence's tokens (prompt and output). Plain Python, no torch.

    The search runs in C: the tokens as 32-bit integers are a byte string, and bytes.rfind finds
    the n-gram's byte pattern; a hit counts only at a multiple of 4 bytes (a whole token). Each
    sequence's byte string is kept while the sequence lives and extended by its new tokens
    (token_ids only ever grow: drafts never enter them, preemption keeps them).
    """

    def __init__(self, config: SpeculativeConfig) -> None:
        self.num_speculative_tokens = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.num_drafts_at = config.num_drafts_at  # per sequence, after a step of a batch size
        self._bytes: WeakKeyDictionary[Sequence, bytearray] = WeakKeyDictionary()

    def propose_for(self, seq: Sequence, max_model_len: int, k: int | None = None) -> list[int]:
        """At most k (default num_speculative_tokens) drafts for a sequence's next step: none
        for a structured output (its grammar would have to vet them), none past max_tokens or
        max_model_len."""
        params = seq.sampling_params
        if params.structured_outputs is not None:
            return []
        room = max_model_len - seq.num_tokens
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - seq.num_output_tokens - 1)
        k = room if k is None else min(k, room)
        if k <= 0:
            return []
        data = self._bytes.get(seq)
        if data is None:
            data = self._bytes[seq] = bytearray()
        data += array("i", seq.token_ids[len(data) // 4 :]).tobytes()
        return self.propose(seq.token_ids, k, data)

    def propose(
        self, token_ids: list[int], max_num_drafts: int, data: bytes | bytearray | None = None
    ) -> list[int]:
        """At most min(num_speculative_tokens, max_num_drafts) tokens to follow token_ids (data:
        them as int32 bytes, if at hand)."""
        k = min(self.num_speculative_tokens, max_num_drafts)
        num_tokens = len(token_ids)
        if k <= 0 or num_tokens <= self.min_n:
            return []
        if data is None:
            data = array("i", token_ids).tobytes()
        haystack_end = 4 * (num_tokens - 1)  # a match must be followed by a token
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            pattern = data[-4 * n :]
            end = haystack_end
            while True:
                at = data.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % 4 == 0:
                    first = at // 4 + n
                    return token_ids[first : first + k]
                end = at + len(pattern) - 1  # the next candidate starts before this one
        return []
