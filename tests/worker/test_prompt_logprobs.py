"""SamplingParams.prompt_logprobs against transformers' full-sequence log-softmax, through
chunked prefill, prefix-cache hits, parallel sampling, preemption and async scheduling."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from tests.cli_util import run_in_process, tiny

PROMPTS = [list(range(40, 90)), [5, 9, 200, 31], [100], [7] * 23 + [3, 1, 4]]


@pytest.fixture(scope="module")
def hf_model(tiny_llama_path):
    return AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()


def reference(hf_model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row p - 1 is prompt token p's distribution."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def check(hf_model, prompt: list[int], got, k: int, tol: float = 1e-4) -> None:
    assert got is not None and len(got) == len(prompt) and got[0] is None
    ref = reference(hf_model, prompt)
    for p in range(1, len(prompt)):
        entry, row = got[p], ref[p - 1]
        assert next(iter(entry)) == prompt[p]  # the prompt token first
        top = row.topk(k).indices.tolist() if k else []
        assert set(entry) == {prompt[p], *top}
        for token_id, logprob in entry.items():
            assert logprob.logprob == pytest.approx(row[token_id].item(), abs=tol)
            assert logprob.rank == int((row > row[token_id]).sum()) + 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_match_transformers(tiny_llama_path, hf_model, async_scheduling):
    """Prefill in chunks of 16 tokens, so that a prompt's logprobs come from several steps."""
    llm = LLM(
        str(tiny_llama_path),
        block_size=4,
        max_num_batched_tokens=16,
        kv_cache_memory=0.01,
        async_scheduling=async_scheduling,
        log=lambda m: None,
    )
    params = [
        SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=k, ignore_eos=True)
        for k in (3, 0, 2, 1)
    ]
    outputs = llm.generate(PROMPTS, params)
    for prompt, param, output in zip(PROMPTS, params, outputs):
        check(hf_model, prompt, output.prompt_logprobs, param.prompt_logprobs)
        assert len(output.outputs[0].token_ids) == 3
    plain = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=3))
    assert plain[0].prompt_logprobs is None


def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(tiny_llama_path, hf_model):
    llm = LLM(str(tiny_llama_path), block_size=4, kv_cache_memory=0.01, log=lambda m: None)
    prefix = list(range(40, 80))
    llm.generate([prefix + [1, 2]], SamplingParams(temperature=0, max_tokens=2))
    hits = llm.engine.block_manager.num_prefix_cache_hits
    prompt = prefix + [3, 4, 5]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2, n=2)
    [output] = llm.generate([prompt], params)
    check(hf_model, prompt, output.prompt_logprobs, 2)
    assert llm.engine.block_manager.num_prefix_cache_hits == hits  # no hit taken
    [again] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))
    assert llm.engine.block_manager.num_prefix_cache_hits > hits  # its blocks were cached
    assert again.outputs[0].token_ids == output.outputs[0].token_ids
    # 43 tokens: the 10 full blocks of 4 found, the last token computed
    assert (output.num_cached_tokens, again.num_cached_tokens) == (0, 40)


def test_prompt_logprobs_survive_preemption_by_recompute(tiny_llama_path, hf_model):
    """A pool of 24 blocks of 4 tokens for 4 sequences growing to 10-15 blocks: preempted ones
    recompute their prompts, whose logprobs are kept once."""
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads of 16, float32
    llm = LLM(
        str(tiny_llama_path),
        block_size=4,
        kv_cache_memory=24 * 4 * bytes_per_token / 2**30,
        preemption_mode="recompute",
        log=lambda m: None,
    )
    prompts = [list(range(40, 70)), list(range(90, 110)), [5, 9, 200, 31] * 5, [8] * 12]
    params = SamplingParams(temperature=0, max_tokens=30, prompt_logprobs=1, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert llm.engine.stats.num_preemptions >= 1
    for prompt, output in zip(prompts, outputs):
        check(hf_model, prompt, output.prompt_logprobs, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prompt_logprobs_on_a_gpu(head64_llama_path):
    """Chunked prefill with decode graphs and async scheduling, in float32 as the reference: the
    prompt logprobs come back with the step's samples (heads of 64 for the cupy kernels)."""
    hf_model = AutoModelForCausalLM.from_pretrained(head64_llama_path, dtype=torch.float32)
    llm = LLM(
        str(head64_llama_path),
        device="cuda",
        dtype="float32",
        block_size=16,
        max_num_batched_tokens=16,
        kv_cache_memory=0.01,
        enforce_eager=False,
        async_scheduling=True,
        log=lambda m: None,
    )
    assert llm.engine.runner.decode_graphs is not None
    params = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params)):
        check(hf_model.eval(), prompt, output.prompt_logprobs, 2, tol=1e-3)


def test_prompt_logprobs_must_not_be_negative():
    with pytest.raises(ValueError, match="prompt_logprobs must be >= 0"):
        SamplingParams(prompt_logprobs=-1)


def test_run_records_prompt_logprobs(tiny_llama_path, capsys):
    """--prompt-logprobs K for every line; a line's own "prompt_logprobs" overrides it."""
    lines = [
        {"prompt": [5, 9, 200, 31]},
        {"prompt": [7, 7, 7], "prompt_logprobs": 0},
        {"prompt": [8, 8], "prompt_logprobs": None},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    args = ["run", "-", "-o", "-", "--prompt-logprobs", "2", *tiny(tiny_llama_path)]
    code, stdout, stderr = run_in_process(capsys, *args, stdin=stdin)
    assert code == 0, stderr
    first, second, third = (json.loads(line) for line in stdout.splitlines())
    assert first["prompt_logprobs"][0] is None and len(first["prompt_logprobs"]) == 4
    steps = first["prompt_logprobs"][1:]
    assert [step["token_id"] for step in steps] == [9, 200, 31]
    assert all(isinstance(step["token"], str) for step in steps)
    assert all([top["rank"] for top in step["top_logprobs"]] == [1, 2] for step in steps)
    assert [(s["token_id"], s["top_logprobs"]) for s in second["prompt_logprobs"][1:]] == [
        (7, []),
        (7, []),
    ]
    assert third["prompt_logprobs"] is None
