import sys
from typing import Any, Protocol

from pagedgen.core.sequence import Sequence, SequenceStatus
from pagedgen.sampling_params import SamplingParams

# Prompt tokens decoded ahead of the first output token, so that tokenizers that strip the
# leading space of a text (SentencePiece) see the first output token mid-text. vLLM uses 5.
NUM_PROMPT_CONTEXT_TOKENS = 5


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int], **kwargs: bool) -> str: ...


def rust_backend(tokenizer: Tokenizer | None) -> Any | None:
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer whose decode(ids,
    skip_special_tokens=s, clean_up_tokenization_spaces=False) is exactly the backend's
    decode(ids, skip_special_tokens=s): PreTrainedTokenizerFast._decode in transformers 4.46 to 5
    (spaces_between_special_tokens is an option of slow tokenizers only). None for any other
    tokenizer, or a subclass that overrides decode or _decode."""
    transformers = sys.modules.get("transformers")
    if tokenizer is None or transformers is None:
        return None
    fast, base = transformers.PreTrainedTokenizerFast, transformers.PreTrainedTokenizerBase
    cls = type(tokenizer)
    if not isinstance(tokenizer, fast) or cls.decode is not base.decode:
        return None
    return tokenizer.backend_tokenizer if cls._decode is fast._decode else None


class StopChecker:
    """Detokenizes each new token of a sequence and finishes the sequence when it must stop.

    Call check(seq) once after every token appended to a running sequence. Rules, as in vLLM:
    - Stop tokens: seq.sampling_params.stop_token_ids, and all_stop_token_ids (the engine puts the
      tokenizer's eos ids there, plus the stop_token_ids) unless ignore_eos. The token's text is
      left out of output_text unless include_stop_str_in_output. stop_reason is the token id for a
      stop_token_ids hit and None for eos.
    - Stop strings: output_text is cut before the stop string (after it when
      include_stop_str_in_output) and stop_reason is the stop string.
    - Neither counts until more than min_tokens tokens have been generated.
    - A complete structured output grammar (grammar_terminated) stops the sequence, stop_reason
      None, whatever min_tokens says: the grammar allows no further token.
    - Otherwise max_tokens output tokens or max_model_len tokens in all finish the sequence as
      FINISHED_LENGTH_CAPPED; a stop on the same token wins over the length cap.

    Text is decoded once, when the sequence finishes, unless it has stop strings: only they need
    the text as it grows (output_text is set on every finished sequence, and on running ones
    only with stop strings). Decoded once, the text is the full decode of the output after the
    same prompt context, which is what the incremental decode below gives too, with two
    exceptions: an output that ends inside a multi-byte character is replayed incrementally,
    so that the incomplete character is left out alike; and in an invalid UTF-8 run of
    byte-fallback tokens mid-output, which a full decode blanks whole, the incremental decode
    keeps the characters it emitted before the run turned invalid.

    Incremental detokenization is vLLM's detokenize_incrementally: per sequence,
    token_ids[prefix_offset:read_offset] is text already emitted, kept only as context, and
    token_ids[read_offset:] is not emitted yet. Each step decodes the two small windows
    [prefix_offset:read_offset] and [prefix_offset:] and emits the difference, unless the latter
    ends in U+FFFD (a multi-byte character split across tokens), in which case it waits.
    A fast tokenizer's windows go straight to its Rust backend (rust_backend), past transformers'
    decode wrapper, which costs more than the decode itself. One Rust call per window: a step's
    decode_batch is no faster run sequentially, and run in parallel it starts rayon threads that
    contend with torch's.
    """

    def __init__(self, tokenizer: Tokenizer | None, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.backend = rust_backend(tokenizer)
        self._decode_fn = self.backend.decode if self.backend is not None else self._decode_slow
        self._offsets: dict[int, tuple[int, int]] = {}  # seq_id -> (prefix_offset, read_offset)

    def check(self, seq: Sequence, grammar_terminated: bool = False) -> None:
        output_token_ids = seq.output_token_ids
        assert output_token_ids and not seq.is_finished, seq
        params = seq.sampling_params
        token_id = output_token_ids[-1]
        can_stop = len(output_token_ids) > params.min_tokens
        is_stop_token = can_stop and (
            token_id in params.stop_token_ids
            or (not params.ignore_eos and token_id in params.all_stop_token_ids)
        )
        new_text = ""
        if (
            params.stop
            and self._detokenizes(params)
            and (not is_stop_token or params.include_stop_str_in_output)
        ):
            new_text = self._decode_new_text(seq)
            if new_text:
                seq.output_text += new_text

        if is_stop_token:
            stop_reason = token_id if token_id in params.stop_token_ids else None
            drop = not params.include_stop_str_in_output  # the stop token's text is left out
            self.finish(seq, SequenceStatus.FINISHED_STOPPED, stop_reason, drop_last_token=drop)
            return
        if can_stop and params.stop and new_text:
            found = find_stop_string(seq.output_text, len(new_text), params.stop)
            if found is not None:
                stop_str, index = found
                if params.include_stop_str_in_output:
                    index += len(stop_str)
                seq.output_text = seq.output_text[:index]
                self.finish(seq, SequenceStatus.FINISHED_STOPPED, stop_str)
                return
        if grammar_terminated:
            self.finish(seq, SequenceStatus.FINISHED_STOPPED)
            return
        if seq.num_tokens >= self.max_model_len or (
            params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens
        ):
            self.finish(seq, SequenceStatus.FINISHED_LENGTH_CAPPED)

    def free(self, seq: Sequence) -> None:
        """Drops the detokenizer state of a sequence finished elsewhere (an abort)."""
        self._offsets.pop(seq.seq_id, None)

    def finish(
        self,
        seq: Sequence,
        status: SequenceStatus,
        stop_reason: int | str | None = None,
        error: str | None = None,
        drop_last_token: bool = False,  # a stop token, whose text the output leaves out
    ) -> None:
        """Ends seq, its text decoded where it was not as it grew, and drops its state."""
        params = seq.sampling_params
        if not params.stop and self._detokenizes(params):
            seq.output_text = self._decode_output(seq, seq.num_output_tokens - drop_last_token)
        seq.finish(status, error)
        seq.stop_reason = stop_reason
        self.free(seq)

    def _detokenizes(self, params: SamplingParams) -> bool:
        return params.detokenize and self.tokenizer is not None

    def _decode_output(self, seq: Sequence, num_output_tokens: int) -> str:
        """The text of seq's first num_output_tokens: the incremental decode's first step over
        them all, one decode after the prompt context."""
        prompt_token_ids, params = seq.prompt_token_ids, seq.sampling_params
        output_token_ids = seq.output_token_ids[:num_output_tokens]
        if not output_token_ids:
            return ""
        text, _ = self._next_text(prompt_token_ids, output_token_ids, None, params)
        if text:
            return text
        # No text: none at all, or the output ends inside a character, which byte-fallback
        # decoders may blank with the complete ones before it: replay, token by token.
        offsets = None
        for end in range(1, len(output_token_ids) + 1):
            new_text, offsets = self._next_text(
                prompt_token_ids, output_token_ids[:end], offsets, params
            )
            text += new_text
        return text

    def _decode_new_text(self, seq: Sequence) -> str:
        offsets = self._offsets.get(seq.seq_id)
        new_text, offsets = self._next_text(
            seq.prompt_token_ids, seq.output_token_ids, offsets, seq.sampling_params
        )
        if new_text:
            self._offsets[seq.seq_id] = offsets
        return new_text

    def _next_text(
        self,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        offsets: tuple[int, int] | None,
        params: SamplingParams,
    ) -> tuple[str, tuple[int, int]]:
        """The text the last output token adds, and the offsets after it (unchanged where it
        adds none); offsets None: before the first output token."""
        num_prompt_tokens = len(prompt_token_ids)
        if offsets is None:
            prefix_offset = max(num_prompt_tokens - NUM_PROMPT_CONTEXT_TOKENS, 0)
            read_offset = num_prompt_tokens
        else:
            prefix_offset, read_offset = offsets
        if prefix_offset >= num_prompt_tokens:
            window = output_token_ids[prefix_offset - num_prompt_tokens :]
        else:
            window = prompt_token_ids[prefix_offset:] + output_token_ids
        skip_special_tokens = params.skip_special_tokens
        decode = self._decode_fn
        prefix_window = window[: read_offset - prefix_offset]
        prefix_text = decode(prefix_window, skip_special_tokens) if prefix_window else ""
        text = decode(window, skip_special_tokens)  # never empty: it ends with the new token
        if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
            return "", (prefix_offset, read_offset)
        return text[len(prefix_text) :], (read_offset, num_prompt_tokens + len(output_token_ids))

    def _decode_slow(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(
            token_ids,
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )


def find_stop_string(text: str, num_new_chars: int, stop: list[str]) -> tuple[str, int] | None:
    """The earliest occurrence of a stop string that ends within the last num_new_chars characters
    of text, as (stop string, index); None if there is none. Older text was searched before."""
    found: tuple[str, int] | None = None
    for stop_str in stop:
        start = max(len(text) - num_new_chars - len(stop_str) + 1, 0)
        index = text.find(stop_str, start)
        if index != -1 and (found is None or index < found[1]):
            found = (stop_str, index)
    return found
