"""Structured output after the reasoning: with a reasoning parser (EngineConfig's
reasoning_parser, vLLM's), a request's constraint holds the answer only once the model has
closed its reasoning, as vLLM's structured output does; the reasoning itself runs free."""

from typing import Any

from pagedgen.core.sequence import Sequence

# Where the reasoning opens and closes: <think> and </think> (one special token each in Qwen3
# and DeepSeek-R1); gpt-oss's harmony channels, analysis and final.
MARKERS = {
    "deepseek_r1": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
    "openai_gptoss": ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>"),
}


def reasoning_markers(tokenizer: Any, parser: str = "qwen3") -> tuple[list[int], list[int]]:
    """The token ids of the parser's opening and closing markers."""
    return tuple(tokenizer.encode(t, add_special_tokens=False) for t in MARKERS[parser])


def find_last(tokens: list[int], pattern: list[int]) -> int:
    """The index just past the last occurrence of pattern in tokens, or -1."""
    n = len(pattern)
    for end in range(len(tokens), n - 1, -1):
        if tokens[end - n : end] == pattern:
            return end
    return -1


def find_first(tokens: list[int], pattern: list[int], start: int = 0) -> int:
    """The index just past the first occurrence of pattern in tokens[start:], or -1."""
    n = len(pattern)
    for end in range(start + n, len(tokens) + 1):
        if tokens[end - n : end] == pattern:
            return end
    return -1


class ReasoningGate:
    """Where each sequence's constrained output begins: just past the first </think> of its
    output, or at its first token where the prompt has closed the reasoning already (a </think>
    after the last <think>, as Qwen3's template writes with thinking off); for gpt-oss, just
    past its final channel's header."""

    def __init__(self, markers: tuple[list[int], list[int]]) -> None:
        self.start_ids, self.end_ids = markers  # <think>'s and </think>'s token ids
        self._found: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens searched, start or -1)

    def content_start(self, seq: Sequence) -> int | None:
        """The index in seq's output where its constrained part begins, or None while it
        reasons."""
        searched, start = self._found.get(seq.seq_id, (0, -1))
        if start < 0 and searched == 0:
            prompt = seq.prompt_token_ids
            if find_last(prompt, self.end_ids) > find_last(prompt, self.start_ids):
                start = 0
        outputs = seq.output_token_ids
        if start < 0:
            from_index = max(0, searched - len(self.end_ids) + 1)
            start = find_first(outputs, self.end_ids, from_index)
        self._found[seq.seq_id] = (len(outputs), start)
        return None if start < 0 else start
