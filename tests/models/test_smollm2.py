"""The headline proof: the real SmolLM2-135M, greedy, token for token equal to transformers
(its Q4_1 weights dequantized, as transformers reads them); and computed on the 4-bit weights as
they are, the same tokens whatever the batch, close to those."""

import pytest
import torch

from pagedgen import LLM, SamplingParams
from tests.conftest import smollm2_transformers

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "Explain in simple terms how a rainbow forms.",
    "Hi",
    "Translate to French: I would like a cup of coffee, please.",
    "Here is a list of the planets of the solar system, in order from the sun:",
    "A recipe for pancakes needs flour, eggs, milk and",
]
MAX_TOKENS = [64, 40, 64, 52, 64, 33, 64, 45, 64, 58]


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    return smollm2_transformers(smollm2_path)


@pytest.fixture(scope="module")
def references(hf_model, smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    refs = []
    for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        refs.append(out[0, len(prompt) :].tolist())
    return prompts, refs


def test_greedy_equals_transformers_in_one_continuous_batch_with_preemption(
    smollm2_path, references
):
    prompts, refs = references
    bytes_per_token = 2 * 30 * 3 * 64 * 4
    # 16 blocks of 16 tokens for 10 prompts of up to ~120 tokens plus 64 each, 4 at a time:
    # admissions, finishes at different steps and at least one recompute preemption.
    llm = LLM(
        str(smollm2_path),
        max_num_seqs=4,
        kv_cache_memory=16 * 16 * bytes_per_token / 2**30,
        quantization="none",
    )
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats
    assert stats.num_preemptions >= 1
    llm.engine.block_manager.check_integrity()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_blocks
    for n, ref, output in zip(MAX_TOKENS, refs, outputs):
        assert len(ref) == n and output.outputs[0].token_ids == ref
        assert output.outputs[0].finish_reason == "length"


def test_chat_stops_at_eos(smollm2_path):
    llm = LLM(str(smollm2_path), kv_cache_memory=0.1)
    (output,) = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=64),
    )
    completion = output.outputs[0]
    assert completion.finish_reason == "stop"
    assert "Paris" in completion.text
    assert completion.token_ids[-1] in llm.engine.eos_token_ids


def test_native_q4_1_is_batch_independent_and_as_likely_as_the_dequantized_model(
    smollm2_path, references
):
    """Greedy tokens equal whatever the batch; the references' mean log-likelihood, teacher
    forced, within 0.1 % of the dequantized model's (activations as ~15-bit integers: near ties
    may still pick other tokens). The tied LM head computes on the embedding's Q8_0 integers."""
    from pagedgen.layers.linear import QUANTIZED, Linear

    prompts, refs = references
    llm = LLM(str(smollm2_path), kv_cache_memory=0.1, log=lambda m: None)
    model = llm.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert sum(m.weight.numel() == 0 for m in layers) >= 30 * 4  # q/k/v, o, gate/up, down: 4-bit
    assert model.lm_head.layout == QUANTIZED and model.lm_head.quant.formats == ["int8 g32"]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], q)[0].outputs[0].token_ids for p, q in zip(prompts, params)]
    assert batched == alone

    def mean_logprob(engine: LLM) -> float:
        scored = SamplingParams(max_tokens=1, prompt_logprobs=0)
        texts = [{"prompt_token_ids": p + r} for p, r in zip(prompts, refs)]
        total = count = 0
        for output, p, r in zip(engine.generate(texts, scored), prompts, refs):
            steps = output.prompt_logprobs[len(p) :]
            total += sum(step[t].logprob for step, t in zip(steps, r))
            count += len(r)
        return total / count

    dense = LLM(str(smollm2_path), kv_cache_memory=0.1, quantization="none", log=lambda m: None)
    native, reference = mean_logprob(llm), mean_logprob(dense)
    assert abs(native - reference) <= 0.001 * abs(reference), (native, reference)
