"""gpt-oss beyond tests/models/test_models.py's greedy equality: OpenAI's MXFP4 checkpoints load as
their dequantized weights, and the sinks stay float32 in a bfloat16 model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS, PROMPTS, reference_greedy

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # the 4-bit float's magnitudes, by code & 7
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def mxfp4_reference(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[E, rows, G, 16] bytes (two codes each, the low nibble first) and [E, rows, G] exponents
    -> [E, G * 32, rows], element by element as the format defines it."""
    codes = torch.stack((blocks & 0xF, blocks >> 4), dim=-1).flatten(-2).long()  # [E, rows, G, 32]
    values = torch.tensor(E2M1)[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    values = values * torch.exp2(scales.float() - 127)[..., None]
    return values.flatten(-2).transpose(1, 2)


def test_mxfp4_dequantizes_as_the_format_defines():
    from pagedgen.loader.mxfp4_weights import dequantize_parts

    torch.manual_seed(0)
    blocks = torch.randint(0, 256, (3, 6, 2, 16), dtype=torch.uint8)
    scales = torch.randint(120, 130, (3, 6, 2), dtype=torch.uint8)
    dense = dequantize_parts({"blocks": blocks, "scales": scales}, {"quant_method": "mxfp4"})
    assert dense.shape == (3, 64, 6)
    assert torch.equal(dense.float(), mxfp4_reference(blocks, scales))


def quantized_experts(dense_shape: torch.Size, generator: torch.Generator):
    """Random MXFP4 parts for a stacked [E, in, out] expert tensor: blocks [E, out, in / 32, 16],
    scales [E, out, in / 32] near 2 ** -3, so the experts' outputs stay moderate."""
    experts, inputs, outputs = dense_shape
    blocks = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), generator=generator)
    scales = torch.randint(122, 126, (experts, outputs, inputs // 32), generator=generator)
    return blocks.to(torch.uint8), scales.to(torch.uint8)


@pytest.mark.slow
def test_an_mxfp4_checkpoint_runs_as_its_dequantized_weights(tmp_path):
    """OpenAI's layout: each stacked expert tensor as <name>_blocks and <name>_scales, its bias
    unquantized, quantization_config {"quant_method": "mxfp4"}. pagedgen's greedy tokens equal
    transformers' on a dense checkpoint of the same values."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS["gpt-oss"]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    dense, quantized = tmp_path / "dense", tmp_path / "mxfp4"
    model.save_pretrained(dense)
    build_tokenizer(dense)
    tensors = load_file(dense / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    packed = {}
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantized_experts(tensors[name].shape, generator)
            tensors[name] = mxfp4_reference(blocks, scales).contiguous()
            packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    assert len(packed) == 4 * config.num_hidden_layers
    save_file(tensors, dense / "model.safetensors", metadata={"format": "pt"})
    quantized.mkdir()
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (quantized / file).write_bytes((dense / file).read_bytes())
    kept = {n: t for n, t in tensors.items() if not n.endswith(("_proj", "_proj.weight")) or
            "experts" not in n}  # fmt: skip
    save_file({**kept, **packed}, quantized / "model.safetensors", metadata={"format": "pt"})
    config_json = json.loads((quantized / "config.json").read_text())
    config_json["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
    }
    (quantized / "config.json").write_text(json.dumps(config_json))

    reference = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    expected = [reference_greedy(reference, prompt, 12) for prompt in PROMPTS]
    llm = LLM(str(quantized), kv_cache_memory=0.01, log=lambda message: None)
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [list(out.outputs[0].token_ids) for out in outputs] == expected


def test_a_truncated_mxfp4_checkpoint_is_refused(tmp_path):
    from pagedgen.loader.quantized import dequantized

    weights = [("model.layers.0.mlp.experts.down_proj_blocks", torch.zeros(2, 4, 1, 16))]
    with pytest.raises(ValueError, match="down_proj lacks its \\['scales'\\]"):
        list(dequantized(iter(weights), {"quant_method": "mxfp4"}))


@pytest.mark.slow
def test_sinks_stay_float32_in_a_bfloat16_model(tmp_path):
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS["gpt-oss"]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), dtype="bfloat16", kv_cache_memory=0.01, log=lambda message: None)
    ours = llm.engine.runner.model.layers[1].self_attn.sinks
    assert ours.dtype == torch.float32
    assert torch.equal(ours, model.model.layers[1].self_attn.sinks.float())
    outputs = llm.generate(PROMPTS, GREEDY)
    assert all(len(out.outputs[0].token_ids) == 12 for out in outputs)
