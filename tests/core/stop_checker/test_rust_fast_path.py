"""The Rust fast path of StopChecker against its transformers decode path, on SmolLM2's tokenizer:
the same output_text after every token, the same stop decisions, stop_reason and status."""

import copy
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pagedgen.core.sequence import Sequence, SequenceStatus
from pagedgen.core.stop_checker import StopChecker, rust_backend
from pagedgen.sampling_params import SamplingParams
from tests.core.stop_checker.test_incremental_text import CountingTokenizer

# Byte-level BPE splits the multi-byte characters into several tokens (U+FFFD until complete);
# the <|...|> pieces encode as special tokens.
PIECES = [
    "the", " quick", " fox", " Grüße", " 日本語", "🙂", "🇯🇵", " €5", "é", " ", "  ", "\n", ",",
    "<|im_end|>", "<|im_start|>", "<|endoftext|>", " hello", " world", "ok", "ん", "\t",
]  # fmt: skip
NUM_STREAMS = 300


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_path)


def random_tokens(
    tokenizer: PreTrainedTokenizerBase, rng: random.Random, max_len: int
) -> list[int]:
    """Text tokens, with now and then a random id (a stray byte, a special token)."""
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, max_len)))
    token_ids = tokenizer.encode(text)
    for _ in range(rng.randint(0, 3)):
        token_id = rng.randrange(20) if rng.random() < 0.5 else rng.randrange(len(tokenizer))
        token_ids.insert(rng.randint(0, len(token_ids)), token_id)
    return token_ids


def random_case(
    tokenizer: PreTrainedTokenizerBase, rng: random.Random
) -> tuple[list[int], list[int], SamplingParams]:
    prompt = random_tokens(tokenizer, rng, 8)[: rng.choice([0, 1, 3, 6, 100])]
    output = random_tokens(tokenizer, rng, 30)
    detokenize = rng.random() < 0.85
    stop: list[str] = []
    if detokenize and rng.random() < 0.6:  # substrings of the text, often across tokens
        text = tokenizer.decode(output, skip_special_tokens=False)
        for _ in range(rng.randint(1, 3)):
            start = rng.randrange(len(text))
            stop.append(text[start : start + rng.randint(1, 6)])
    eos = tokenizer.eos_token_id
    stop_token_ids = rng.sample(output, rng.randint(1, 2)) if rng.random() < 0.2 else []
    max_tokens = rng.choice([None, None, rng.randint(1, len(output) + 2)])
    min_tokens = rng.randint(0, 4) if rng.random() < 0.3 else 0
    if max_tokens is not None:
        min_tokens = min(min_tokens, max_tokens)
    if rng.random() < 0.3:
        output.insert(rng.randint(0, len(output)), eos)
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        ignore_eos=rng.random() < 0.2,
        include_stop_str_in_output=rng.random() < 0.4,
        skip_special_tokens=rng.random() < 0.5,
        detokenize=detokenize,
    )
    params.all_stop_token_ids = set(params.stop_token_ids) | (
        {eos} if not params.ignore_eos else set()
    )
    return prompt, output, params


def run_interleaved(
    checker: StopChecker, cases: list[tuple[list[int], list[int], SamplingParams]]
) -> list[list[tuple[str, SequenceStatus, int | str | None]]]:
    """Feeds all cases' tokens a step at a time, as the engine does for a batch, and records each
    sequence's (output_text, status, stop_reason) after every token."""
    seqs = []
    for seq_id, (prompt, _, params) in enumerate(cases):
        seq = Sequence(seq_id, f"request-{seq_id}", prompt, params)
        seq.status = SequenceStatus.RUNNING
        seqs.append(seq)
    history: list[list[tuple[str, SequenceStatus, int | str | None]]] = [[] for _ in cases]
    for step in range(max(len(output) for _, output, _ in cases)):
        for seq, (_, output, _), record in zip(seqs, cases, history):
            if seq.is_finished or step >= len(output):
                continue
            seq.append_token_id(output[step])
            checker.check(seq)
            record.append((seq.output_text, seq.status, seq.stop_reason))
    assert not checker._offsets.keys() & {seq.seq_id for seq in seqs if seq.is_finished}
    return history


def test_smollm2_takes_the_fast_path(tokenizer: PreTrainedTokenizerBase) -> None:
    assert StopChecker(tokenizer, 100).backend is tokenizer.backend_tokenizer
    assert StopChecker(CountingTokenizer(tokenizer), 100).backend is None
    assert rust_backend(None) is None


def test_no_fast_path_past_an_overridden_decode(tokenizer: PreTrainedTokenizerBase) -> None:
    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids: list[int], skip_special_tokens: bool = False, **kwargs) -> str:
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    class Decorated(PreTrainedTokenizerFast):
        def decode(self, token_ids: list[int], skip_special_tokens: bool = False, **kwargs) -> str:
            return "[" + super().decode(token_ids, skip_special_tokens, **kwargs) + "]"

    for cls in (Shouting, Decorated):
        subclassed = cls(tokenizer_object=tokenizer.backend_tokenizer)
        assert rust_backend(subclassed) is None


@pytest.mark.parametrize("seed", range(4))
def test_fast_path_matches_transformers_decode(
    tokenizer: PreTrainedTokenizerBase, seed: int
) -> None:
    rng = random.Random(seed)
    cases = [random_case(tokenizer, rng) for _ in range(NUM_STREAMS // 4)]
    fast = run_interleaved(StopChecker(tokenizer, 10_000), cases)
    slow = run_interleaved(StopChecker(CountingTokenizer(tokenizer), 10_000), cases)
    for case, fast_history, slow_history in zip(cases, fast, slow):
        assert fast_history == slow_history, case
    # The cases must reach what they are meant to test.
    finals = [history[-1] for history in slow]
    assert any(reason in case[2].stop for (_, _, reason), case in zip(finals, cases))
    assert any(status == SequenceStatus.FINISHED_LENGTH_CAPPED for _, status, _ in finals)
    assert any("\ufffd" in tokenizer.decode(case[1][:i]) for case in cases for i in range(9))
    assert any("<|im_end|>" in text for text, _, _ in finals)


def test_fast_path_max_model_len(tokenizer: PreTrainedTokenizerBase) -> None:
    rng = random.Random(7)
    cases = [random_case(tokenizer, rng) for _ in range(40)]
    fast = run_interleaved(StopChecker(tokenizer, 20), cases)
    slow = run_interleaved(StopChecker(CountingTokenizer(tokenizer), 20), cases)
    assert fast == slow


@pytest.mark.parametrize("seed", range(4))
def test_text_decoded_at_the_finish_is_the_incremental_text(
    tokenizer: PreTrainedTokenizerBase, seed: int
) -> None:
    """Sequences without stop strings decode their text once, when they finish: the same text,
    stop decisions and reasons as with a stop string that never matches, which decodes it as it
    grows."""
    rng = random.Random(100 + seed)
    cases, forced = [], []
    for prompt, output, params in (random_case(tokenizer, rng) for _ in range(NUM_STREAMS // 4)):
        params.max_tokens = min(params.max_tokens or len(output), len(output))  # all finish
        incremental = copy.copy(params)
        incremental.stop = params.stop or ["\x00never"]
        cases.append((prompt, output, params))
        forced.append((prompt, output, incremental))
    at_finish = run_interleaved(StopChecker(tokenizer, 10_000), cases)
    as_it_grows = run_interleaved(StopChecker(tokenizer, 10_000), forced)
    num_deferred = 0
    for (_, _, params), deferred, grown in zip(cases, at_finish, as_it_grows):
        assert deferred[-1] == grown[-1] and deferred[-1][1].is_finished
        if not params.stop and params.detokenize:
            num_deferred += 1
            assert all(text == "" for text, _, _ in deferred[:-1])
    assert num_deferred >= 10
    assert any("\ufffd" in tokenizer.decode(case[1][:i]) for case in cases for i in range(9))
