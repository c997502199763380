"""GPT-2 and OPT checkpoints as the hub ships them: GPT-2's tensors without "transformer." and
with the attention-mask buffers (openai-community/gpt2), OPT's as "decoder.*" (facebook/opt-*)."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from tests.conftest import build_tokenizer
from tests.models.model_configs import COMMON, CONFIGS
from tests.models.test_models import PROMPTS, reference_greedy


def gpt2_hub_names(weights: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    weights = {name.removeprefix("transformer."): t for name, t in weights.items()}
    for i in range(num_layers):
        weights[f"h.{i}.attn.bias"] = torch.ones(1, 1, 256, 256).tril()
        weights[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return weights


def opt_hub_names(weights: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    return {name.removeprefix("model."): t for name, t in weights.items()}


def tiny_checkpoint(tmp_path, name: str, **overrides) -> AutoModelForCausalLM:
    """A tiny model of CONFIGS[name], saved with a tokenizer; its norms and biases off their
    init, so that each must load."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name], **overrides))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name or "ln_" in param_name or param_name.endswith("bias"):
                param.add_(torch.randn_like(param), alpha=0.1)
    model.save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name, rewrite", [("gpt2", gpt2_hub_names), ("opt-350m", opt_hub_names)])
def test_hub_checkpoint_names(tmp_path, name, rewrite):
    model = tiny_checkpoint(tmp_path, name)
    path = tmp_path / "model.safetensors"
    weights = rewrite(load_file(path), model.config.num_hidden_layers)
    save_file(weights, path, metadata={"format": "pt"})

    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=lambda m: None)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params)):
        assert output.outputs[0].token_ids == reference_greedy(model, prompt, 16)
