"""Beam search on the real SmolLM2: equal to a plain beam search over transformers' logits."""

import pytest
import torch
from transformers import AutoTokenizer

from pagedgen import LLM, BeamSearchParams
from pagedgen.core.beam_search import beam_search_score
from tests.conftest import smollm2_transformers

PROMPTS = ["The capital of France is", "def add(a, b):"]


@pytest.fixture(scope="module")
def hf(smollm2_path):
    model = smollm2_transformers(smollm2_path)
    return model, AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path), kv_cache_memory=0.05, quantization="none", log=lambda m: None)


@torch.no_grad()
def reference_beam_search(model, prompt, params: BeamSearchParams, eos: set[int]):
    """Recomputes every beam from scratch each step, without a cache. vLLM's rule: each beam
    proposes its top 2 * width tokens, eos proposals retire, the width best others live on."""

    def score(beam):
        tokens, cumulative = beam
        ends = tokens[-1] in eos and not params.ignore_eos
        return beam_search_score(len(tokens), cumulative, ends, params.length_penalty)

    beams, finished = [(list(prompt), 0.0)], []
    for _ in range(params.max_tokens):
        candidates = []
        # all live beams have the same length, so one forward pass scores them all
        logits = model(torch.tensor([tokens for tokens, _ in beams])).logits[:, -1].float()
        for (tokens, cumulative), row in zip(beams, torch.log_softmax(logits, -1)):
            top = torch.topk(row, 2 * params.beam_width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist()):
                beam = (tokens + [token], cumulative + logprob)
                (finished if token in eos and not params.ignore_eos else candidates).append(beam)
        beams = sorted(candidates, key=score, reverse=True)[: params.beam_width]
    best = sorted(finished + beams, key=score, reverse=True)[: params.beam_width]
    return [(tokens[len(prompt) :], cumulative) for tokens, cumulative in best]


@pytest.mark.parametrize(
    "params",
    [
        BeamSearchParams(beam_width=3, max_tokens=10),
        BeamSearchParams(beam_width=2, max_tokens=12, length_penalty=0.5),
        BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True),
    ],
)
def test_beams_equal_a_plain_beam_search_over_transformers_logits(hf, llm, params):
    model, tokenizer = hf
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outputs = llm.beam_search(prompts, params)
    for prompt, output in zip(prompts, outputs):
        expected = reference_beam_search(model, prompt, params, llm.engine.eos_token_ids)
        assert [c.token_ids for c in output.outputs] == [tokens for tokens, _ in expected]
        for completion, (_, cumulative) in zip(output.outputs, expected):
            assert completion.cumulative_logprob == pytest.approx(cumulative, abs=1e-3)
    llm.engine.block_manager.check_integrity()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_blocks


def test_without_eos_and_length_penalty_it_equals_transformers_generate(hf, llm):
    """With length_penalty 0 and eos ignored, both keep the width best cumulative log-probs."""
    model, tokenizer = hf
    width, max_tokens = 3, 12
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=True)
    params.length_penalty = 0.0
    outputs = llm.beam_search(prompts, params)
    for prompt, output in zip(prompts, outputs):
        generated = model.generate(
            torch.tensor([prompt]),
            num_beams=width,
            num_return_sequences=width,
            max_new_tokens=max_tokens,
            do_sample=False,
            length_penalty=0.0,
            eos_token_id=None,
            pad_token_id=0,
        )
        expected = [row[len(prompt) :] for row in generated.tolist()]
        assert [c.token_ids for c in output.outputs] == expected


def test_beams_share_blocks(llm):
    width, max_tokens = 4, 40
    prompt = list(range(1000, 1100))
    engine = llm.engine
    engine.add_request("beams", prompt, BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.block_manager.num_used_blocks)
    independent = width * engine.block_manager.num_blocks_for(len(prompt) + max_tokens)
    assert peak < 0.5 * independent
