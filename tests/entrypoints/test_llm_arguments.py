"""LLM() takes vLLM's engine arguments: its own, those of vLLM that change nothing here (taken
and ignored), and no other; generate() and chat() say when requests fail."""

import logging

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.entrypoints.llm import IGNORED_VLLM_ARGS

QUIET = dict(log=lambda message: None, kv_cache_memory=0.01)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(str(tiny_llama_path), max_model_len=64, **QUIET)


def test_vllm_arguments_that_change_nothing_are_taken(tiny_llama_path, llm):
    ignored = {name: True for name in IGNORED_VLLM_ARGS}
    vllm_like = LLM(
        str(tiny_llama_path), max_model_len=64, tensor_parallel_size=1, **ignored, **QUIET
    )
    assert (
        vllm_like.generate(["hello"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        == llm.generate(["hello"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    )


def test_an_argument_vllm_does_not_have_is_named(tiny_llama_path):
    with pytest.raises(TypeError, match="unknown engine arguments \\['max_num_seq'\\]"):
        LLM(str(tiny_llama_path), max_num_seq=8, **QUIET)


def test_more_than_one_device_is_refused(tiny_llama_path):
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1.*one device"):
        LLM(str(tiny_llama_path), tensor_parallel_size=2, **QUIET)


def test_failed_requests_are_warned_of_once_per_call(llm, caplog):
    prompts = ["ok", "", "a" * 200]
    with caplog.at_level(logging.WARNING, logger="pagedgen"):
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.error is None for o in outputs] == [True, False, False]
    assert outputs[1].outputs[0].finish_reason == "error"
    [record] = [r for r in caplog.records if r.name == "pagedgen"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("2 of 3 requests failed")
    assert outputs[1].error in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pagedgen"):
        llm.chat([{"role": "user", "content": "a" * 200}], GREEDY, use_tqdm=False)
        llm.generate(["ok"], GREEDY, use_tqdm=False)
    [record] = [r for r in caplog.records if r.name == "pagedgen"]
    assert record.getMessage().startswith("1 of 1 requests failed")
