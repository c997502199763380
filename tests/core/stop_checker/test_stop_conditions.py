from transformers import PreTrainedTokenizerFast

from pagedgen.core.sequence import SequenceStatus
from tests.core.stop_checker.test_incremental_text import (
    MULTI_BYTE_TEXT,
    generate,
    reference_text,
    tokenizer,  # noqa: F401 (the fixture, parametrized)
)


def test_stop_string_across_tokens(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    text = " the quick brown fox jumps"
    output_token_ids = tokenizer.encode(text)
    ends = [len(tokenizer.decode(output_token_ids[: i + 1])) for i in range(len(output_token_ids))]
    stop_end = text.strip().index("brown f") + len("brown f")
    completing = next(i for i, end in enumerate(ends) if end >= stop_end)
    assert ends[completing - 1] > text.strip().index("brown f")  # spans a token boundary

    seq = generate(tokenizer, output_token_ids, stop=["brown f"])
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason == "brown f"
    assert seq.num_output_tokens == completing + 1
    assert seq.output_text == " the quick "

    seq = generate(tokenizer, output_token_ids, stop=["brown f"], include_stop_str_in_output=True)
    assert seq.output_text == " the quick brown f"


def test_earliest_stop_string_wins(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    seq = generate(tokenizer, tokenizer.encode(" the quick brown fox"), stop=["fox", "ui", "qu"])
    assert (seq.output_text, seq.stop_reason) == (" the ", "qu")


def test_multi_byte_stop_string(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    seq = generate(tokenizer, tokenizer.encode(MULTI_BYTE_TEXT), stop=["本語"])
    assert seq.output_text == " Grüße, 日"
    assert seq.stop_reason == "本語"


def test_stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    output_token_ids = tokenizer.encode(" the quick brown fox jumps")
    stop_id = output_token_ids[2]
    seq = generate(tokenizer, output_token_ids, stop_token_ids=[stop_id])
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason == stop_id
    assert seq.output_token_ids == output_token_ids[:3]
    assert seq.output_text == reference_text(tokenizer, seq, num_output_tokens=2)

    seq = generate(
        tokenizer, output_token_ids, stop_token_ids=[stop_id], include_stop_str_in_output=True
    )
    assert seq.output_text == reference_text(tokenizer, seq)


def test_eos(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    eos = tokenizer.eos_token_id
    output_token_ids = tokenizer.encode(" hello world") + [eos] + tokenizer.encode(" more")
    seq = generate(tokenizer, output_token_ids, skip_special_tokens=False)
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason is None
    assert seq.output_token_ids[-1] == eos
    assert seq.output_text == " hello world"

    seq = generate(tokenizer, output_token_ids, ignore_eos=True, skip_special_tokens=False)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
    assert seq.output_text == " hello world<eos> more"


def test_min_tokens_delays_stops(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    eos = tokenizer.eos_token_id
    hello = tokenizer.encode(" hello")
    seq = generate(tokenizer, [eos] + hello + [eos], min_tokens=1)
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.num_output_tokens == len(hello) + 2

    # Only the last token is past min_tokens, so only the last "fox" counts.
    output_token_ids = tokenizer.encode(" fox fox fox")
    seq = generate(tokenizer, output_token_ids, stop=["fox"], min_tokens=len(output_token_ids) - 1)
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.num_output_tokens == len(output_token_ids)
    assert seq.output_text == " fox fox "


def test_length_caps(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    output_token_ids = tokenizer.encode(" the quick brown fox jumps over the lazy dog")
    seq = generate(tokenizer, output_token_ids, max_tokens=3)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED and seq.stop_reason is None
    assert seq.num_output_tokens == 3
    assert seq.output_text == reference_text(tokenizer, seq)

    num_prompt_tokens = len(tokenizer.encode("hello there, say"))
    seq = generate(tokenizer, output_token_ids, max_model_len=num_prompt_tokens + 2)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
    assert seq.num_tokens == num_prompt_tokens + 2


def test_stop_wins_over_length_on_the_same_token(tokenizer: PreTrainedTokenizerFast) -> None:  # noqa: F811
    output_token_ids = tokenizer.encode(" hello") + [tokenizer.eos_token_id]
    seq = generate(tokenizer, output_token_ids, max_tokens=len(output_token_ids))
    assert seq.status == SequenceStatus.FINISHED_STOPPED
