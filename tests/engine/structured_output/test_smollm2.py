"""Structured output on the real SmolLM2-135M: every completion is valid under its constraint,
with a large pool, under recompute and swap preemption, with n = 4 and with beam search; a
grammar that allows everything changes nothing. The 200-prompt ShareGPT proof and the timings
are in benchmarks/structured_output.py."""

import re
import threading

import pytest
import torch

from pagedgen import LLM, SamplingParams, StructuredOutputsParams
from pagedgen.core.beam_search import BeamSearchParams
from tests.structured_workload import EXTRACTION_SCHEMA, validation_error

REQUESTS = [
    "How do I reverse a linked list in Python? Show me the code.",
    "Write a short poem about the autumn rain in Paris.",
    "What is the derivative of x squared times the sine of x?",
]
INSTRUCTION = (
    "Describe the request below as JSON: its topic, its category, its difficulty from 1 to 5, "
    "one to three keywords, its language and whether it needs code.\n\nRequest: "
)
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, float32
JSON = StructuredOutputsParams(json=EXTRACTION_SCHEMA)
MAX_TOKENS = 100  # SmolLM2's documents under the schema take 50 to 65 tokens


def pool_gib(num_blocks: int) -> float:
    return num_blocks * 16 * BYTES_PER_TOKEN / 2**30


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a shared machine a second spinning thread slows a 135M model
    several times over."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def llm(smollm2_path) -> LLM:
    return LLM(str(smollm2_path), kv_cache_memory=pool_gib(256), log=lambda _: None)


@pytest.fixture(scope="module")
def prompts(llm) -> list[list[int]]:
    chats = [[{"role": "user", "content": INSTRUCTION + text}] for text in REQUESTS]
    return [llm.apply_chat_template(chat) for chat in chats]


@pytest.fixture(scope="module")
def greedy_json(llm, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_outputs=JSON)
    outputs = llm.generate(prompts, params)
    assert_all_valid(outputs, 1)
    return [out.outputs[0].token_ids for out in outputs]


def assert_all_valid(outputs: list, n: int) -> None:
    for out in outputs:
        assert out.error is None and len(out.outputs) == n, out.error
        for completion in out.outputs:
            assert completion.finish_reason == "stop", completion.text
            assert validation_error(completion.text) is None, completion.text


def test_json_schema_outputs_parse_and_validate(greedy_json, llm, prompts):
    stats = llm.engine.structured_output.stats
    assert stats.num_grammars_compiled >= 1 and stats.num_masked_steps > 0
    sampled = SamplingParams(
        n=4, temperature=0.8, seed=0, max_tokens=MAX_TOKENS, structured_outputs=JSON
    )
    assert_all_valid(llm.generate(prompts[:1], sampled), 4)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_json_schema_under_preemption(smollm2_path, prompts, greedy_json, mode):
    """Sequences of about 9 blocks (a prompt of 5 and a document of 4): 3 greedy requests in 20
    blocks are preempted (recompute: the matcher replays the tokens kept), 2 groups of n = 4
    (21 blocks each) in 34 are swapped out and in."""
    num_blocks = 20 if mode == "recompute" else 34
    small = LLM(
        str(smollm2_path),
        kv_cache_memory=pool_gib(num_blocks),
        preemption_mode=mode,
        log=lambda _: None,
    )
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_outputs=JSON)
    sampled = SamplingParams(
        n=4, temperature=0.8, seed=1, max_tokens=MAX_TOKENS, structured_outputs=JSON
    )
    if mode == "recompute":
        outputs = small.generate(prompts, greedy)
        assert_all_valid(outputs, 1)
        assert [out.outputs[0].token_ids for out in outputs] == greedy_json
    else:
        outputs = small.generate(prompts[:2], sampled)
        assert_all_valid(outputs, 4)
        assert small.engine.stats.num_blocks_swapped_out > 0
    assert small.engine.stats.num_preemptions > 0


def test_a_grammar_that_allows_everything_changes_no_greedy_token(llm, prompts):
    free = SamplingParams(temperature=0, max_tokens=24)  # both stop at EOS
    anything = SamplingParams(
        temperature=0, max_tokens=24, structured_outputs=StructuredOutputsParams(regex=r"(?s:.*)")
    )
    expected = [out.outputs[0].token_ids for out in llm.generate(prompts, free)]
    assert [out.outputs[0].token_ids for out in llm.generate(prompts, anything)] == expected


def test_regex_and_choice_outputs_match(llm, prompts):
    date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    choices = ["coding", "poetry", "math"]
    for structured, accept in [
        (StructuredOutputsParams(regex=date), lambda text: re.fullmatch(date, text)),
        (StructuredOutputsParams(choice=choices), lambda text: text in choices),
    ]:
        for params in (
            SamplingParams(temperature=0, max_tokens=32, structured_outputs=structured),
            SamplingParams(
                n=2, temperature=1.0, seed=3, max_tokens=32, structured_outputs=structured
            ),
        ):
            for out in llm.generate(prompts, params):
                for completion in out.outputs:
                    assert completion.finish_reason == "stop", completion.text
                    assert accept(completion.text), completion.text


def test_beam_search_proposes_only_what_the_grammar_allows(llm, prompts):
    choices = ["a coding question", "a poem request", "a math problem"]
    params = BeamSearchParams(
        beam_width=3, max_tokens=12, structured_outputs=StructuredOutputsParams(choice=choices)
    )
    for out in llm.beam_search(prompts[:2], params):
        assert len(out.outputs) == 3
        assert all(completion.text in choices for completion in out.outputs), out.outputs


def test_other_requests_decode_while_a_grammar_compiles(llm, prompts):
    engine, manager = llm.engine, llm.engine.structured_output
    release, compile_now = threading.Event(), manager._compile

    def slow_compile(params: StructuredOutputsParams):
        assert release.wait(timeout=60)
        return compile_now(params)

    manager._compile = slow_compile
    try:
        pair = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}
        params = SamplingParams(
            temperature=0, structured_outputs=StructuredOutputsParams(json=pair)
        )
        engine.add_request("json", prompts[0], params)
        engine.add_request("free", prompts[1], SamplingParams(temperature=0, max_tokens=6))
        finished = []
        while engine.has_unfinished_requests():
            outputs = engine.step()
            finished += [out.request_id for out in outputs]
            if finished == ["free"] and not release.is_set():
                assert manager.num_pending == 1  # "free" ran to its end beside the compile
                release.set()
    finally:
        manager._compile = compile_now
    assert finished == ["free", "json"]
