import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pagedgen.core.sequence import Sequence, SequenceStatus
from pagedgen.core.stop_checker import StopChecker
from pagedgen.sampling_params import SamplingParams

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello there, general kenobi",
    "stop here and say goodbye to the world",
]
# Not in CORPUS, so they come out as several byte tokens each.
MULTI_BYTE_TEXT = " Grüße, 日本語 costs €5 🙂 ok"


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2 style: byte-level BPE."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<eos>", "<sep>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """Llama style: SentencePiece-like BPE over "▁"-joined words, unknown characters as byte
    tokens <0xNN>, a decoder that strips the leading space of the text."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<eos>", "<sep>"])
    tokenizer.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="<unk>")


class CountingTokenizer:
    """Counts the decodes; StopChecker cannot see the Rust backend through it, so every decode
    goes through transformers' decode."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.decoded_lengths: list[int] = []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int], **kwargs: bool) -> str:
        self.decoded_lengths.append(len(token_ids))
        return self.tokenizer.decode(token_ids, **kwargs)


BYTE_LEVEL, BYTE_FALLBACK = byte_level_tokenizer(), byte_fallback_tokenizer()
# Each through StopChecker's Rust fast path, and through transformers' decode.
TOKENIZERS = {
    "byte_level": BYTE_LEVEL,
    "byte_fallback": BYTE_FALLBACK,
    "byte_level-transformers_decode": CountingTokenizer(BYTE_LEVEL),
    "byte_fallback-transformers_decode": CountingTokenizer(BYTE_FALLBACK),
}


@pytest.fixture(params=list(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return TOKENIZERS[request.param]


def generate(
    tokenizer: PreTrainedTokenizerFast,
    output_token_ids: list[int],
    prompt: str = "hello there, say",
    max_model_len: int = 10_000,
    checker: StopChecker | None = None,
    **kwargs,
) -> Sequence:
    """Feeds output_token_ids one by one, as the engine would, until the sequence finishes: at
    the last one unless told (max_tokens), as then its text is all decoded."""
    params = SamplingParams(**{"max_tokens": len(output_token_ids), **kwargs})
    params.all_stop_token_ids = {tokenizer.eos_token_id, *params.stop_token_ids}
    seq = Sequence(0, "request-0", tokenizer.encode(prompt), params)
    seq.status = SequenceStatus.RUNNING
    checker = checker or StopChecker(tokenizer, max_model_len)
    for token_id in output_token_ids:
        seq.append_token_id(token_id)
        checker.check(seq)
        assert "\ufffd" not in seq.output_text
        if seq.is_finished:
            break
    return seq


def reference_text(
    tokenizer: PreTrainedTokenizerFast,
    seq: Sequence,
    skip: bool = True,
    num_output_tokens: int | None = None,
) -> str:
    """The text the output (or its first num_output_tokens) adds after the prompt, decoding
    everything at once."""
    prompt = tokenizer.decode(seq.prompt_token_ids, skip_special_tokens=skip)
    output_token_ids = seq.output_token_ids[:num_output_tokens]
    full = tokenizer.decode(seq.prompt_token_ids + output_token_ids, skip_special_tokens=skip)
    assert full.startswith(prompt)
    return full[len(prompt) :]


# Text decoded once at the finish (no stop strings), or as it grows (a stop string never met)
DECODES = {"at-finish": [], "incremental": ["\x00never"]}


@pytest.mark.parametrize("stop", DECODES.values(), ids=DECODES)
def test_multi_byte_text_matches_full_decode(
    tokenizer: PreTrainedTokenizerFast, stop: list[str]
) -> None:
    output_token_ids = tokenizer.encode(MULTI_BYTE_TEXT)
    partial = [t for t in output_token_ids if "\ufffd" in tokenizer.decode([t])]
    assert len(partial) >= 6  # the test must split characters across tokens
    seq = generate(tokenizer, output_token_ids, stop=stop)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
    assert seq.output_text == reference_text(tokenizer, seq)
    assert seq.output_text.strip() == MULTI_BYTE_TEXT.strip()


@pytest.mark.parametrize("stop", DECODES.values(), ids=DECODES)
@pytest.mark.parametrize("case", range(30))
def test_random_text_matches_full_decode(
    tokenizer: PreTrainedTokenizerFast, case: int, stop: list[str]
) -> None:
    rng = random.Random(case)
    pieces = ["the", " quick", " fox", "é", "日本", "🙂", "€", " ", ",", "<sep>", "world", "\n"]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
    skip = rng.random() < 0.5
    seq = generate(tokenizer, tokenizer.encode(text), skip_special_tokens=skip, stop=stop)
    assert seq.output_text == reference_text(tokenizer, seq, skip)


def test_a_character_left_incomplete_is_left_out_alike(tokenizer: PreTrainedTokenizerFast) -> None:
    """Outputs that end inside a multi-byte character: both decodes give the text of the
    characters before it, which a full decode ends with U+FFFD (byte-fallback decoders blank
    the complete characters of the same run of byte tokens too)."""
    output_token_ids = tokenizer.encode(" ok 日本語 🙂")
    whole = reference_text(tokenizer, generate(tokenizer, output_token_ids))
    num_cut = 0
    for end in range(1, len(output_token_ids) + 1):
        texts = {
            name: generate(tokenizer, output_token_ids[:end], stop=stop).output_text
            for name, stop in DECODES.items()
        }
        assert texts["at-finish"] == texts["incremental"]
        full = reference_text(tokenizer, generate(tokenizer, output_token_ids[:end]))
        assert whole.startswith(texts["at-finish"])
        assert texts["at-finish"].startswith(full.rstrip("\ufffd"))
        num_cut += full.endswith("\ufffd")
    assert num_cut >= 3


def test_an_invalid_byte_run_mid_output_decodes_as_a_full_decode() -> None:
    """Byte-fallback tokens 日 (E6 97 A5) then a stray E6, then " ok": a full decode blanks the
    whole invalid run, and so does the decode at the finish; the incremental decode had
    emitted 日 before the stray byte came."""
    tokenizer = BYTE_FALLBACK
    output_token_ids = tokenizer.convert_tokens_to_ids(["<0xE6>", "<0x97>", "<0xA5>", "<0xE6>"])
    output_token_ids += tokenizer.encode(" ok")
    texts = {}
    for name, stop in DECODES.items():
        params = SamplingParams(max_tokens=len(output_token_ids), stop=stop)
        params.all_stop_token_ids = {tokenizer.eos_token_id}
        seq = Sequence(0, "request-0", tokenizer.encode("hello there, say"), params)
        seq.status = SequenceStatus.RUNNING
        checker = StopChecker(tokenizer, 10_000)
        for token_id in output_token_ids:
            seq.append_token_id(token_id)
            checker.check(seq)
        assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
        texts[name] = seq.output_text
    assert texts["at-finish"] == reference_text(tokenizer, seq) == "\ufffd" * 4 + " ok"
    assert texts["incremental"] == "日" + "\ufffd" * 3 + " ok"


def test_without_stop_strings_the_text_is_decoded_once(tokenizer: PreTrainedTokenizerFast) -> None:
    counting = CountingTokenizer(getattr(tokenizer, "tokenizer", tokenizer))
    checker = StopChecker(counting, 10_000)
    output_token_ids = tokenizer.encode(MULTI_BYTE_TEXT)
    running = generate(tokenizer, output_token_ids, checker=checker, max_tokens=None)
    assert not running.is_finished and running.output_text == ""
    assert counting.decoded_lengths == [] and not checker._offsets
    seq = generate(tokenizer, output_token_ids, checker=checker)
    assert seq.output_text == reference_text(tokenizer, seq)
    context = min(len(seq.prompt_token_ids), 5)
    assert counting.decoded_lengths == [context, context + len(output_token_ids)]


def test_takes_the_fast_path_when_it_can(tokenizer: PreTrainedTokenizerFast) -> None:
    checker = StopChecker(tokenizer, 10_000)
    if isinstance(tokenizer, CountingTokenizer):
        assert checker.backend is None
    else:
        assert checker.backend is tokenizer.backend_tokenizer


def test_decodes_only_a_small_window(tokenizer: PreTrainedTokenizerFast) -> None:
    counting = CountingTokenizer(getattr(tokenizer, "tokenizer", tokenizer))
    output_token_ids = tokenizer.encode(MULTI_BYTE_TEXT * 20)
    checker = StopChecker(counting, 10_000)
    seq = generate(tokenizer, output_token_ids, checker=checker, stop=DECODES["incremental"])
    assert seq.output_text == reference_text(tokenizer, seq)
    assert len(output_token_ids) > 200
    assert max(counting.decoded_lengths) <= 10


def test_special_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    output_token_ids = tokenizer.encode(" hello<sep> world")
    assert "<sep>" not in generate(tokenizer, output_token_ids).output_text
    kept = generate(tokenizer, output_token_ids, skip_special_tokens=False)
    assert "<sep>" in kept.output_text


def test_state_is_freed_on_finish(tokenizer: PreTrainedTokenizerFast) -> None:
    checker = StopChecker(tokenizer, 10_000)
    output_token_ids = tokenizer.encode(" the quick brown fox")
    generate(tokenizer, output_token_ids, checker=checker, max_tokens=2)
    # the incremental decode's state, kept while the sequence runs
    stop = DECODES["incremental"]
    generate(tokenizer, output_token_ids, checker=checker, max_tokens=2, stop=stop)
    running = generate(tokenizer, output_token_ids[:2], checker=checker, max_tokens=None, stop=stop)
    assert list(checker._offsets) == [running.seq_id]
    checker.free(running)
    assert not checker._offsets
