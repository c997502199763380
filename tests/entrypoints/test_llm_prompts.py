"""LLM.generate takes prompts as vLLM does: text, token ids, TextPrompt and TokensPrompt dicts,
one or a list; a dict it cannot honor fails before anything runs."""

import pytest

from pagedgen import LLM, BeamSearchParams, SamplingParams

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


def test_a_request_that_can_never_run_fails_alone(llm):
    """A prompt token past the vocabulary (or negative), or more parallel samples than
    max_num_seqs, fails its own request with an error; the rest of the batch runs."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    vocab = llm.engine.vocab_size
    prompts = [[5, vocab], [5, 6], {"prompt_token_ids": [-1, 5]}]
    outside, fine, negative = llm.generate(prompts, params, use_tqdm=False)
    assert outside.error == f"prompt token {vocab} is outside the vocabulary of {vocab}"
    assert negative.error == f"prompt token -1 is outside the vocabulary of {vocab}"
    assert outside.outputs[0].finish_reason == "error" and outside.outputs[0].token_ids == []
    assert fine.error is None and len(fine.outputs[0].token_ids) == 3
    max_num_seqs = llm.engine.config.max_num_seqs
    stop = SamplingParams(stop_token_ids=[-1], min_tokens=1, max_tokens=2)
    [negative_stop] = llm.generate([[5, 6]], stop, use_tqdm=False)
    assert negative_stop.error == "token -1 is outside the vocabulary"
    many = SamplingParams(n=max_num_seqs + 1, max_tokens=2)
    [too_many, ran] = llm.generate([[5, 6], [5, 6]], [many, params], use_tqdm=False)
    assert too_many.error == (
        f"n ({max_num_seqs + 1}) exceeds max_num_seqs ({max_num_seqs}), the most sequences that "
        "run at once"
    )
    assert ran.outputs[0].token_ids == fine.outputs[0].token_ids


def test_output_stops_at_max_model_len(tiny_llama_path):
    """As vLLM's: a prompt that fits runs even where prompt + max_tokens does not, its output
    cut at max_model_len (finish_reason "length"); only a longer prompt fails."""
    llm = LLM(str(tiny_llama_path), max_model_len=32, **QUIET)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [list(range(5, 35)), list(range(5, 37)), list(range(5, 38))]
    cut, full, too_long = llm.generate(prompts, params, use_tqdm=False)
    assert cut.error is None and len(cut.outputs[0].token_ids) == 2
    assert cut.outputs[0].finish_reason == "length"
    assert full.error is None and len(full.outputs[0].token_ids) == 1
    assert too_long.error == "prompt (33 tokens) exceeds max_model_len (32)"
    [alone] = llm.generate(
        [prompts[0]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False
    )
    assert alone.outputs[0].token_ids == cut.outputs[0].token_ids
    sampled = SamplingParams(n=3, temperature=1.0, max_tokens=16, ignore_eos=True, seed=0)
    [three] = llm.generate([prompts[0]], sampled, use_tqdm=False)
    assert [len(o.token_ids) for o in three.outputs] == [2, 2, 2]
    [beams] = llm.beam_search([{"prompt_token_ids": prompts[0]}], BeamSearchParams(2, 16))
    assert [len(o.token_ids) for o in beams.outputs] == [2, 2]


def test_chat_takes_openai_text_parts(llm):
    """Content given as a list of text parts is the parts joined by newlines, as vLLM gives a
    text template; a part of another type fails clearly."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    [listed] = llm.chat([{"role": "user", "content": parts}], params, use_tqdm=False)
    [joined] = llm.chat([{"role": "user", "content": "hello\nthere"}], params, use_tqdm=False)
    assert listed.prompt_token_ids == joined.prompt_token_ids
    assert listed.outputs[0].token_ids == joined.outputs[0].token_ids
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(ValueError, match="only text content parts"):
        llm.chat([{"role": "user", "content": [image]}], params, use_tqdm=False)
    assert llm.get_tokenizer() is llm.tokenizer


def test_seed_none_draws_a_fresh_seed(tiny_llama_path):
    """LLM(seed=None), as vLLM's: each engine samples from a seed of its own."""
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = [LLM(str(tiny_llama_path), seed=None, **QUIET) for _ in range(2)]
    assert all(isinstance(llm.engine.config.seed, int) for llm in runs)
    first, second = (llm.generate([[5, 6]], params, use_tqdm=False)[0] for llm in runs)
    assert first.outputs[0].token_ids != second.outputs[0].token_ids
