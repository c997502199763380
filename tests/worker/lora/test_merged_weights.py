"""LoRA without PEFT: an adapter folder written by hand in PEFT's format, against transformers
running the base model with the adapter merged into its weights (W + scaling * B @ A). Runs on
a CPU, and on a GPU (CUDA graphs with and without adapters, async scheduling) where there is one,
as GPU machines may lack PEFT."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, LoRARequest, SamplingParams
from tests.conftest import HEAD64, build_tokenizer
from tests.models.test_models import COMMON, CONFIGS, reference_greedy

RANK, ALPHA = 4, 8.0
TARGETS = {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"}
PROMPTS = [[5, 9, 200, 31], list(range(40, 63)), [7] * 11]


def write_adapter(base, folder, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A rank-4 adapter on q, v and down of every layer, saved as PEFT saves one."""
    generator = torch.Generator().manual_seed(seed)
    tensors, pairs = {}, {}
    for name, module in base.named_modules():
        if not any(name.endswith(target) for target in TARGETS):
            continue
        a = torch.randn(RANK, module.in_features, generator=generator) * 0.3
        b = torch.randn(module.out_features, RANK, generator=generator) * 0.3
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
        pairs[name] = (a, b)
    folder.mkdir()
    save_file(tensors, folder / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return pairs


def merged(base, pairs):
    model = copy.deepcopy(base)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            modules[name].weight += (ALPHA / RANK) * b @ a
    return model


def build_adapters(root, **overrides):
    """A base model with two adapters, and transformers' models of each merged."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS["llama"], **overrides))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    base.save_pretrained(root / "base")
    build_tokenizer(root / "base")
    models = {0: base}
    for i in (1, 2):
        models[i] = merged(base, write_adapter(base, root / f"adapter{i}", seed=i))
    requests = {i: LoRARequest(f"adapter{i}", i, str(root / f"adapter{i}")) for i in (1, 2)}
    return root / "base", models, requests


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return build_adapters(tmp_path_factory.mktemp("lora-merged"))


@pytest.fixture(scope="module")
def head64_adapters(tmp_path_factory):
    """Heads of 64, which the cupy decode kernels (and so CUDA graphs) take."""
    root = tmp_path_factory.mktemp("lora-merged-head64")
    return build_adapters(root, **HEAD64)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_adapters_equal_their_merged_weights(request, device):
    fixture = "head64_adapters" if device == "cuda" else "adapters"
    folder, models, requests = request.getfixturevalue(fixture)
    llm = LLM(
        str(folder),
        device=device,
        dtype="float32",
        enable_lora=True,
        max_loras=2,
        kv_cache_memory=0.01,
        async_scheduling=device == "cuda",
        log=lambda m: None,
    )
    assert llm.engine.runner.lora_decode_graphs is not None
    jobs = [(prompt, kind) for prompt in PROMPTS for kind in (0, 1, 2)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    loras = [requests.get(kind) for _, kind in jobs]
    outputs = llm.generate([prompt for prompt, _ in jobs], params, loras)
    for (prompt, kind), output in zip(jobs, outputs):
        assert output.outputs[0].token_ids == reference_greedy(models[kind], prompt, 12), kind


def test_adapters_with_speculative_decoding(adapters):
    """Drafting sequences of two adapters and the base model in one batch, their steps replayed
    from the adapters' graph set: each still equals its merged weights."""
    folder, models, requests = adapters
    spec = {"num_speculative_tokens": 3, "prompt_lookup_min": 1}
    llm = LLM(
        str(folder),
        enable_lora=True,
        max_loras=2,
        kv_cache_memory=0.01,
        speculative_config=spec,
        log=lambda m: None,
    )
    jobs = [(prompt, kind) for prompt in PROMPTS for kind in (0, 1, 2)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    loras = [requests.get(kind) for _, kind in jobs]
    outputs = llm.generate([prompt for prompt, _ in jobs], params, loras, use_tqdm=False)
    for (prompt, kind), output in zip(jobs, outputs):
        assert output.outputs[0].token_ids == reference_greedy(models[kind], prompt, 24), kind
    assert llm.engine.stats.spec_decode.num_accepted_tokens > 0


def test_a_failed_generate_leaves_the_engine_empty(adapters, tmp_path, monkeypatch):
    """A bad adapter fails the call before any request is queued; an error in the middle of a
    call aborts what it queued, so the next call's request ids are free."""
    folder, models, requests = adapters
    llm = LLM(str(folder), enable_lora=True, kv_cache_memory=0.01, log=lambda m: None)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    broken = LoRARequest("broken", 7, str(tmp_path))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate(PROMPTS[:2], params, [requests[1], broken])
    assert not llm.engine.has_unfinished_requests()
    step, calls = llm.engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a step failed")
        return step()

    monkeypatch.setattr(llm.engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="a step failed"):
        llm.generate(PROMPTS, params, requests[1])
    assert not llm.engine.has_unfinished_requests()
    monkeypatch.setattr(llm.engine, "step", step)
    outputs = llm.generate(PROMPTS, params, requests[2])
    for prompt, output in zip(PROMPTS, outputs):
        assert output.outputs[0].token_ids == reference_greedy(models[2], prompt, 12)


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_preempted_requests_keep_their_adapter(adapters, preemption_mode):
    """10 blocks of 8 tokens while six sequences grow to 4 blocks each: groups are preempted
    and come back (n = 2 groups swap as a whole), with one adapter at a time."""
    folder, models, requests = adapters
    bytes_per_token = 2 * COMMON["num_hidden_layers"] * COMMON["num_key_value_heads"] * 16 * 4
    llm = LLM(
        str(folder),
        block_size=8,
        kv_cache_memory=10 * 8 * bytes_per_token / 2**30,
        preemption_mode=preemption_mode,
        enable_lora=True,
        max_loras=1,
        log=lambda m: None,
    )
    prompts = [[5, 9, 200, 31], [7] * 9, [100, 3], [8, 8, 8], [1, 2, 3, 4, 5], [60] * 6]
    kinds = [1, 2, 0, 2, 1, 0]
    n = 2 if preemption_mode == "swap" else 1
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=n, seed=0)
    outputs = llm.generate(prompts, params, [requests.get(kind) for kind in kinds])
    assert llm.engine.stats.num_preemptions >= 1
    for prompt, kind, output in zip(prompts, kinds, outputs):
        expected = reference_greedy(models[kind], prompt, 24)
        assert [c.token_ids for c in output.outputs] == [expected] * n, kind


def test_embeddings_with_adapters_equal_their_merged_weights(adapters):
    """The pooling runner (LLM.embed) runs each prompt's adapter, mixed in one batch, with
    prefix-cache hits kept within an adapter."""
    import torch.nn.functional as F

    folder, models, requests = adapters
    llm = LLM(str(folder), runner="pooling", enable_lora=True, max_loras=2, kv_cache_memory=0.01)
    jobs = [(prompt, kind) for prompt in PROMPTS for kind in (0, 1, 2)]
    loras = [requests.get(kind) for _, kind in jobs]
    for _ in range(2):  # the second time from the prefix cache
        outputs = llm.embed([prompt for prompt, _ in jobs], lora_request=loras, use_tqdm=False)
        for (prompt, kind), output in zip(jobs, outputs):
            with torch.no_grad():
                hidden = models[kind].model(torch.tensor([prompt])).last_hidden_state[0, -1]
            expected = F.normalize(hidden, dim=0)
            got = torch.tensor(output.outputs.embedding)
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    assert llm.engine.stats.num_prefix_cache_hits > 0
