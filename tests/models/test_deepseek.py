"""DeepSeek-V2/V3 beyond models/test_models.py's greedy equality: the latent cache (one vector per
token and layer, serving as K and V), preemption by swap and prefix hits through it, a V3
checkpoint as DeepSeek publishes it (its multi-token-prediction layer), bfloat16."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from pagedgen.core.kv_geometry import KVGeometry
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS, PROMPTS, reference_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def deepseek_v3(tmp_path_factory):
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS["deepseek-v3"]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for layer in model.model.layers[config.first_k_dense_replace :]:
        layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.2)
    folder = tmp_path_factory.mktemp("deepseek-v3")
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder, model


def test_the_cache_holds_one_latent_per_token_and_layer():
    """DeepSeek-V3's own shape (the config's defaults): 61 layers x (512 + 64) x 2 bytes, where
    each head's K and V would take 61 x 128 x (192 + 128) x 2, 71 times as much."""
    geometry = KVGeometry.of(AutoConfig.for_model("deepseek_v3"), torch.bfloat16)
    assert geometry.latent and (geometry.num_kv_heads, geometry.head_dim) == (1, 576)
    assert geometry.bytes_per_token == 61 * 576 * 2 == 70_272
    assert geometry.cache_shape(10, 16) == (61, 1, 10, 16, 1, 576)
    assert geometry.formula == "61 layers x 576 latent dim x 2 bytes (bfloat16)"


def test_each_layer_binds_its_latent_as_key_and_value(deepseek_v3):
    folder, _ = deepseek_v3
    runner = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None).engine.runner
    assert runner.kv_cache.shape[1] == 1 and runner.cpu_cache.shape[1] == 1
    for i, attention in enumerate(runner.model.attention_layers):
        assert attention.key_cache.data_ptr() == attention.value_cache.data_ptr()
        assert attention.key_cache.data_ptr() == runner.kv_cache[i, 0].data_ptr()
        assert attention.kv_b_proj is None and attention.w_uk.shape == (4, 16, 32)


@pytest.mark.parametrize("backend", ["torch", "reference"])  # the cpu one: test_models.py
def test_every_attention_backend_serves_the_latent(deepseek_v3, backend):
    folder, hf_model = deepseek_v3
    llm = LLM(str(folder), attention_backend=backend, kv_cache_memory=0.01, log=lambda m: None)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, GREEDY)):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_preemption_by_swap_moves_the_latents(deepseek_v3):
    folder, hf_model = deepseek_v3
    bytes_per_token = KVGeometry.of(AutoConfig.from_pretrained(folder), torch.float32)
    pool = 10 * 8 * bytes_per_token.bytes_per_token / 2**30  # 10 blocks for 4 growing sequences
    llm = LLM(str(folder), block_size=8, kv_cache_memory=pool, preemption_mode="swap")
    prompts = [PROMPTS[0], PROMPTS[4], PROMPTS[3], [8, 8, 8]]
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.stats.num_blocks_swapped_out >= 1
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_prefix_hits_read_cached_latents(deepseek_v3):
    folder, hf_model = deepseek_v3
    llm = LLM(str(folder), kv_cache_memory=0.01, enable_prefix_caching=True)
    prefix = list(range(40, 90))
    prompts = [prefix + [7, 8], prefix + [200, 3, 1]]
    first = llm.generate(prompts[:1], GREEDY)[0]
    second = llm.generate(prompts[1:], GREEDY)[0]
    assert second.num_cached_tokens >= 48
    for prompt, output in zip(prompts, (first, second)):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_a_published_v3_checkpoint_skips_its_prediction_layer(deepseek_v3, tmp_path):
    """DeepSeek-V3's release holds a multi-token-prediction layer after the last one (its
    layer 61: eh_proj, enorm, hnorm, a decoder layer, shared_head) and the config's old keys
    (rope_scaling, scoring_func, topk_method); generation ignores the layer, as transformers
    does."""
    folder, hf_model = deepseek_v3
    tensors = load_file(folder / "model.safetensors")
    extra = {
        name.replace("layers.1.", "layers.2."): tensor.clone()
        for name, tensor in tensors.items()
        if "layers.1." in name
    }
    extra["model.layers.2.eh_proj.weight"] = torch.randn(64, 128)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        extra[f"model.layers.2.{norm}.weight"] = torch.ones(64)
    extra["model.layers.2.shared_head.head.weight"] = torch.randn(257, 64)
    save_file({**tensors, **extra}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(
        num_nextn_predict_layers=1,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        rope_scaling={"type": rope.pop("rope_type"), **rope},
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    build_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory=0.01)
    assert len(llm.engine.runner.model.layers) == 2
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, GREEDY)):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_bfloat16_keeps_the_router_bias_float32(deepseek_v3):
    folder, _ = deepseek_v3
    llm = LLM(str(folder), dtype="bfloat16", kv_cache_memory=0.01)
    mlp = llm.engine.runner.model.layers[1].mlp
    assert mlp.e_score_correction_bias.dtype == torch.float32
    assert llm.engine.runner.kv_cache.dtype == torch.bfloat16
    outputs = llm.generate(PROMPTS, GREEDY)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outputs)


KIMI_CONFIG = """from transformers import DeepseekV3Config


class KimiK2Config(DeepseekV3Config):
    model_type = "kimi_k2"
"""


def test_a_config_of_the_models_own_code_needs_trust_remote_code(deepseek_v3, tmp_path):
    """Kimi K2's folder: model_type kimi_k2, whose config class is the folder's own Python
    (auto_map), the DeepseekV3ForCausalLM architecture, routing named by scoring_func."""
    folder, hf_model = deepseek_v3
    for path in folder.iterdir():
        (tmp_path / path.name).symlink_to(path)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="kimi_k2",
        auto_map={"AutoConfig": "configuration_kimi.KimiK2Config"},
        scoring_func="sigmoid",
        topk_method="noaux_tc",
    )
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "configuration_kimi.py").write_text(KIMI_CONFIG)
    with pytest.raises(ValueError, match="--trust-remote-code"):
        LLM(str(tmp_path), kv_cache_memory=0.01)
    llm = LLM(str(tmp_path), trust_remote_code=True, kv_cache_memory=0.01)
    assert llm.engine.hf_config.model_type == "kimi_k2"
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, GREEDY)):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)
