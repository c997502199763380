"""LLM.generate takes prompts as vLLM does: text, token ids, TextPrompt and TokensPrompt dicts,
one or a list; a dict it cannot honor fails before anything runs."""

import pytest

from pagedgen import LLM, SamplingParams

QUIET = dict(log=lambda message: None, kv_cache_memory=0.01)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(str(tiny_llama_path), **QUIET)


def test_every_prompt_form_gives_the_same_completion(llm):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    text = "hello there"
    ids = llm.generate(text, params, use_tqdm=False)[0].prompt_token_ids
    forms = [text, ids, {"prompt": text}, {"prompt_token_ids": ids}]
    outputs = llm.generate(forms, params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [ids] * 4
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
    assert outputs[0].prompt == outputs[2].prompt == text
    one = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    assert len(one) == 1 and one[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "prompt,message",
    [
        ({"text": "hi"}, "needs 'prompt'"),
        ({"prompt": "hi", "multi_modal_data": {"image": object()}}, "multi_modal_data"),
    ],
)
def test_a_dict_it_cannot_honor_fails(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
