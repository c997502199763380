"""Greedy equality with transformers for tiny random-weight models of every architecture."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from pagedgen.core.kv_geometry import KVGeometry
from tests.conftest import build_tokenizer
from tests.models.model_configs import COMMON, CONFIGS

PROMPTS = [[5, 9, 200, 31], [7] * 23, list(range(40, 90)), [100], [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_model(request, tmp_path_factory):
    name = request.param
    kwargs = dict(COMMON, **CONFIGS[name])
    config = AutoConfig.for_model(**kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    untie_initial_values(model)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder, model


def untie_initial_values(model) -> None:
    """Values that init leaves constant made random: norms at 1 and biases at 0 hide a weight or
    bias lost in loading; a router at 0 (DeepSeek-V3's bias; ERNIE's whole gate in transformers
    5.17) ties every expert, and CPU and GPU top-k break ties differently."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.2)
        for name, param in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param), alpha=0.1)
            elif param.dim() == 2 and not param.any():
                param.normal_(0.0, 0.3)


def reference_greedy(
    model, prompt: list[int], max_new_tokens: int, use_cache: bool = True
) -> list[int]:
    """transformers' greedy tokens; use_cache=False runs the whole sequence every step."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=use_cache,
    )
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_transformers(tiny_model):
    folder, hf_model = tiny_model
    max_tokens = [12, 30, 20, 25, 16]
    llm = LLM(str(folder), max_num_seqs=3, kv_cache_memory=0.01)
    model = llm.engine.runner.model
    if llm.engine.runner.backend.name == "cpu" and model.supports_graphs:  # CPU graphs replay
        assert llm.engine.runner.decode_graphs is not None
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate(PROMPTS, params)
    for prompt, n, output in zip(PROMPTS, max_tokens, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, n)


@pytest.mark.slow
def test_greedy_matches_transformers_under_preemption(tiny_model):
    folder, hf_model = tiny_model
    # 10 blocks of 8 tokens, while the 4 sequences grow to 4 blocks each
    bytes_per_token = KVGeometry.of(
        AutoConfig.from_pretrained(folder), torch.float32
    ).bytes_per_token
    llm = LLM(str(folder), block_size=8, kv_cache_memory=10 * 8 * bytes_per_token / 2**30)
    prompts = [PROMPTS[0], PROMPTS[4], PROMPTS[3], [8, 8, 8]]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert llm.engine.stats.num_preemptions >= 1
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_logprobs_match_transformers(tiny_model):
    """Each prompt token's log-probability, against transformers' full forward: catches what
    greedy tokens cannot, a scale on the logits (Granite's logits_scaling) among others."""
    folder, hf_model = tiny_model
    llm = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None)
    prompts = [p for p in PROMPTS if len(p) > 1]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    for prompt, output in zip(prompts, llm.generate(prompts, params)):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(prompt[1:])[:, None])
        got = [step[token].logprob for step, token in zip(output.prompt_logprobs[1:], prompt[1:])]
        torch.testing.assert_close(torch.tensor(got), expected.squeeze(1), atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_is_refused(tmp_path):
    config = AutoConfig.for_model("mamba", num_hidden_layers=1, hidden_size=16, vocab_size=257)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="unsupported architecture.*LlamaForCausalLM"):
        LLM(str(tmp_path))


@pytest.mark.parametrize(
    "name, num_kv_heads",
    [("falcon-7b", 1), ("falcon-40b", 2), ("falcon-11b", 2), ("falcon-sequential", 4)]
    + [("gpt-bigcode-multi-query", 1), ("gpt2", 4), ("gpt_neox", 4), ("llama", 2)],
)
def test_the_cache_holds_the_checkpoints_kv_heads(name, num_kv_heads):
    """Falcon's config names no num_key_value_heads: multi_query means one, the new decoder
    architecture num_kv_heads; the cache must not hold a copy per query head."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    assert KVGeometry.of(config, torch.float32).num_kv_heads == num_kv_heads
