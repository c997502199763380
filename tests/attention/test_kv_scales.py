"""A checkpoint's KV-cache scales (k_scale, v_scale) over an 8-bit cache: K/V stored as
k / k_scale and v / v_scale, as vLLM stores them, so values past fp8's range survive; greedy
outputs equal transformers' attending to K/V rounded that way. Without an 8-bit cache the
scales change nothing."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from pagedgen import LLM
from pagedgen.attention.kv_cache_dtype import FP8_DTYPES, round_through_cache
from tests.attention.test_kv_cache_dtype import QUIET, greedy
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS, PROMPTS, reference_greedy

SCALES = {"k_scale": 8.0, "v_scale": 3.0}  # v's not a power of two: the division rounds


def scaled_kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA over K/V as an 8-bit cache with the module's scales holds them."""
    dtype, k_scale, v_scale = module.kv_cache_dtype, module.k_scale, module.v_scale
    key = round_through_cache(key / k_scale, dtype) * k_scale
    value = round_through_cache(value / v_scale, dtype) * v_scale
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("pagedgen_scaled_fp8_kv", scaled_kv_attention)
AttentionMaskInterface.register("pagedgen_scaled_fp8_kv", sdpa_mask)


def loud_model(name: str, folder, names: tuple[str, str] | None, **scales: float):
    """A tiny model whose K and V run to thousands (k and v projections x 300), past E4M3's 448,
    saved with each layer's scales under names (k's and v's suffix; None: none saved)."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            attention = layer.self_attn
            if hasattr(attention, "qkv_proj"):  # Phi-3's fused rows: q, then k and v
                attention.qkv_proj.weight[config.hidden_size :] *= 300
            else:
                attention.k_proj.weight *= 300
                attention.v_proj.weight *= 300
    model.save_pretrained(folder)
    build_tokenizer(folder)
    if names is not None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        for i in range(config.num_hidden_layers):
            for suffix, scale in zip(names, (scales["k_scale"], scales["v_scale"])):
                tensors[f"model.layers.{i}.self_attn.{suffix}"] = torch.tensor(scale)
        save_file(tensors, path, metadata={"format": "pt"})
    model.set_attn_implementation("pagedgen_scaled_fp8_kv")
    for module in model.modules():
        module.kv_cache_dtype = FP8_DTYPES["fp8"]
        module.k_scale, module.v_scale = scales.get("k_scale", 1.0), scales.get("v_scale", 1.0)
    return model


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("name", ["llama", "qwen3", "phi3"])  # plain, q/k norms, fused qkv
def test_scaled_kv_matches_transformers(tmp_path, name, backend):
    model = loud_model(name, tmp_path, ("k_scale", "v_scale"), **SCALES)
    llm = LLM(
        str(tmp_path),
        kv_cache_dtype="fp8",
        kv_cache_memory=0.01,
        attention_backend=backend,
        **QUIET,
    )
    assert [a.k_scale for a in llm.engine.runner.model.attention_layers] == [8.0, 8.0]
    for prompt, tokens in zip(PROMPTS, greedy(llm, PROMPTS)):
        assert tokens == reference_greedy(model, prompt, 24)


def test_the_scales_keep_what_saturation_loses(tmp_path):
    """Unscaled, the loud K/V saturate at 448 and the greedy tokens change: the test above
    tells scales used from scales dropped."""
    model = loud_model("llama", tmp_path, None, **SCALES)
    scaled = [reference_greedy(model, prompt, 24) for prompt in PROMPTS]
    for module in model.modules():
        module.k_scale = module.v_scale = 1.0
    assert scaled != [reference_greedy(model, prompt, 24) for prompt in PROMPTS]


def test_autofp8_names_and_the_model_dtype_cache(tmp_path):
    """AutoFP8's k_proj/v_proj output_scale are the same scales; a cache in the model's dtype
    ignores them, as vLLM's does."""
    model = loud_model("llama", tmp_path, ("k_proj.output_scale", "v_proj.output_scale"), **SCALES)
    llm = LLM(str(tmp_path), kv_cache_dtype="fp8", kv_cache_memory=0.01, **QUIET)
    for prompt, tokens in zip(PROMPTS, greedy(llm, PROMPTS)):
        assert tokens == reference_greedy(model, prompt, 24)
    plain = LLM(str(tmp_path), kv_cache_memory=0.01, **QUIET)
    assert all(a.qkv_scale is None for a in plain.engine.runner.model.attention_layers)
    model.set_attn_implementation("sdpa")
    for prompt, tokens in zip(PROMPTS, greedy(plain, PROMPTS)):
        assert tokens == reference_greedy(model, prompt, 24)


def test_per_head_scales_are_refused(tmp_path):
    loud_model("llama", tmp_path, ("k_scale", "v_scale"), **SCALES)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.k_scale"] = torch.ones(2)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="per-head KV scales"):
        LLM(str(tmp_path), kv_cache_dtype="fp8", kv_cache_memory=0.01, **QUIET)
