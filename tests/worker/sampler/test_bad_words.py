"""SamplingParams.bad_words through the engine, one step at a time and with async scheduling
(which such requests turn off while they run: matching needs the last tokens on the host)."""

import pytest

from pagedgen import LLM, SamplingParams


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bad_words_never_appear(tiny_llama_path, async_scheduling):
    """A one-token bad word never appears; of a two-token one, the second token never follows
    the first. Steps run one at a time while such a request is unfinished."""
    llm = LLM(
        str(tiny_llama_path),
        kv_cache_memory=0.01,
        async_scheduling=async_scheduling,
        log=lambda m: None,
    )
    prompt, greedy = [5, 9, 200, 31], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    [plain] = llm.generate([prompt], greedy)
    first, second = plain.outputs[0].token_ids[:2]
    words = [llm.tokenizer.decode([first]), llm.tokenizer.decode([first, second])]
    single = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, bad_words=words[:1])
    pair = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, bad_words=words[1:])
    [without_first], [without_pair] = llm.generate([prompt], single), llm.generate([prompt], pair)
    assert first not in without_first.outputs[0].token_ids
    out = without_pair.outputs[0].token_ids
    assert out[0] == first and out[1] != second
    assert all((a, b) != (first, second) for a, b in zip(out, out[1:]))
