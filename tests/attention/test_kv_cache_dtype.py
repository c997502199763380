"""kv_cache_dtype="fp8" / "fp8_e5m2": the pool holds 8-bit K/V, every backend writes the same
bytes, attention sees K/V as the cache holds them (so greedy outputs equal transformers' with K/V
rounded the same way), and outputs do not depend on how the steps were cut."""

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from pagedgen import LLM, SamplingParams
from pagedgen.attention.kv_cache_dtype import FP8_DTYPES, round_through_cache
from pagedgen.config import EngineConfig
from pagedgen.kernels.cpu import cpu_kernel_error
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS, PROMPTS, reference_greedy
from tests.models.test_sliding_window import COMMON as WINDOWED_COMMON
from tests.models.test_sliding_window import CONFIGS as WINDOWED_CONFIGS
from tests.models.test_sliding_window import MAX_TOKENS as WINDOWED_MAX_TOKENS
from tests.models.test_sliding_window import PROMPTS as WINDOWED_PROMPTS

FP8 = ["fp8", "fp8_e5m2"]
QUIET = dict(log=lambda message: None)


def rounded_kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention over K/V rounded as an fp8 cache holds them (the dtype is
    the module's `kv_cache_dtype`, set by the test)."""
    dtype = module.kv_cache_dtype
    key, value = round_through_cache(key, dtype), round_through_cache(value, dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("pagedgen_fp8_kv", rounded_kv_attention)
AttentionMaskInterface.register("pagedgen_fp8_kv", sdpa_mask)  # sdpa's masks, windows included


def tiny_model(name: str, folder, kv_cache_dtype: str, windowed: bool = False):
    common, configs = (WINDOWED_COMMON, WINDOWED_CONFIGS) if windowed else (COMMON, CONFIGS)
    config = AutoConfig.for_model(**dict(common, **configs[name]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    build_tokenizer(folder)
    model.set_attn_implementation("pagedgen_fp8_kv")
    for module in model.modules():
        module.kv_cache_dtype = FP8_DTYPES[kv_cache_dtype]
    return model


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("name", ["llama", "qwen3", "mixtral", "granite"])
def test_greedy_matches_transformers_over_rounded_kv(tmp_path, name, kv_cache_dtype):
    hf_model = tiny_model(name, tmp_path, kv_cache_dtype)
    llm = LLM(str(tmp_path), kv_cache_dtype=kv_cache_dtype, kv_cache_memory=0.01, **QUIET)
    assert llm.engine.runner.kv_cache.dtype == FP8_DTYPES[kv_cache_dtype]
    for prompt, tokens in zip(PROMPTS, greedy(llm, PROMPTS)):
        assert tokens == reference_greedy(hf_model, prompt, 24)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_sliding_windows_over_rounded_kv(tmp_path, name, backend):
    """Windowed layers read only their window of the 8-bit cache, prefix-cache hits included
    (two prompts share 40 tokens), sequences several windows long."""
    if backend == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    hf_model = tiny_model(name, tmp_path, "fp8", windowed=True)
    llm = LLM(str(tmp_path), kv_cache_dtype="fp8", attention_backend=backend, **QUIET)
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in WINDOWED_MAX_TOKENS
    ]
    outputs = llm.generate(WINDOWED_PROMPTS, params, use_tqdm=False)
    for prompt, n, output in zip(WINDOWED_PROMPTS, WINDOWED_MAX_TOKENS, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, n)
    assert llm.engine.stats.num_prefix_cache_hits > 0


def test_rounding_changes_what_the_model_sees(tmp_path):
    """The reference above is not the unrounded model in disguise: E5M2's two mantissa bits
    change some greedy continuation of these prompts."""
    hf_model = tiny_model("llama", tmp_path, "fp8_e5m2")
    rounded = [reference_greedy(hf_model, p, 24) for p in PROMPTS]
    hf_model.set_attn_implementation("sdpa")
    assert rounded != [reference_greedy(hf_model, p, 24) for p in PROMPTS]


SHARED = list(range(10, 60))  # a 50-token prefix, 6 blocks of 8: prefix-cache hits
PREFIX_PROMPTS = [SHARED + [i, i + 1, i + 2] for i in range(100, 106)] + PROMPTS


@pytest.mark.parametrize("kv_cache_dtype", FP8)
def test_outputs_do_not_depend_on_how_steps_are_cut(tiny_llama_path, kv_cache_dtype):
    """Fresh K/V are rounded as the cache rounds them, so a token attends to the same values
    whether its K/V were computed this step or read back: chunked prefill, prefix-cache hits,
    swapping, recomputation, CPU graphs and either CPU backend give one set of tokens."""
    base = dict(kv_cache_dtype=kv_cache_dtype, block_size=8, **QUIET)
    plain = LLM(
        str(tiny_llama_path),
        **base,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        enforce_eager=True,
        attention_backend="torch",
        kv_cache_memory=0.01,
    )
    expected = greedy(plain, PREFIX_PROMPTS)
    geometry = plain.engine.runner.geometry
    small_pool = 24 * 8 * geometry.bytes_per_token / 2**30  # 24 blocks for 12 sequences
    variants = [
        dict(max_num_batched_tokens=16, kv_cache_memory=0.01),  # prompts in chunks of <= 16
        dict(kv_cache_memory=small_pool, preemption_mode="swap"),
        dict(kv_cache_memory=small_pool, preemption_mode="recompute"),
    ]
    backends = ["torch"] + ["cpu"] * (cpu_kernel_error() is None)
    for backend in backends:
        for variant in variants:
            llm = LLM(str(tiny_llama_path), **base, attention_backend=backend, **variant)
            assert greedy(llm, PREFIX_PROMPTS) == expected, (backend, variant)
            stats = llm.engine.stats
            if "preemption_mode" in variant:
                assert stats.num_preemptions >= 1
            else:
                assert stats.num_prefix_cache_hits > 0


def test_fp8_pool_holds_four_times_the_float32_tokens(tiny_llama_path):
    pools = {
        name: LLM(str(tiny_llama_path), kv_cache_dtype=name, kv_cache_memory=0.01, **QUIET)
        for name in ("auto", "fp8", "fp8_e5m2")
    }
    blocks = {name: llm.engine.runner.num_blocks for name, llm in pools.items()}
    assert blocks["fp8"] == blocks["fp8_e5m2"] and blocks["fp8"] // 4 == blocks["auto"]
    assert pools["fp8"].engine.runner.geometry.dtype_bytes == 1
    assert pools["fp8_e5m2"].engine.runner.kv_cache.dtype == torch.float8_e5m2


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="int8")
