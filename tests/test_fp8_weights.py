"""FP8 checkpoints load dequantized: per-tensor, per-channel and block scales, in the layouts of
compressed-tensors, transformers' "fp8" and "fbgemm_fp8", give exactly the engine a checkpoint
of the dequantized weights gives; other quantized formats are refused before anything loads."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedgen import LLM, SamplingParams
from pagedgen.loader.fp8_weights import dequantize

QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = (32, 32)
SCHEMES = {
    "compressed-tensors, per tensor": (
        "weight_scale",
        "tensor",
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                    "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
                }
            },
            "ignore": ["lm_head"],
        },
    ),
    "fbgemm_fp8, per channel": (
        "weight_scale",
        "channel",
        {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0},
    ),
    "fp8, blocks": (
        "weight_scale_inv",
        "block",
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)},
    ),
}


def quantize(weight: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, scale) with the scale's layout for the strategy."""
    finite = torch.finfo(torch.float8_e4m3fn).max
    w = weight.float()
    if strategy == "tensor":
        scale = w.abs().max().reshape(1) / finite
        return (w / scale).to(torch.float8_e4m3fn), scale
    if strategy == "channel":
        scale = w.abs().amax(dim=1, keepdim=True) / finite
        return (w / scale).to(torch.float8_e4m3fn), scale
    rows, columns = BLOCK
    blocks = w.unflatten(0, (-1, rows)).unflatten(2, (-1, columns))  # [R, rows, C, columns]
    scale = blocks.abs().amax(dim=(1, 3)) / finite  # [R, C]
    expanded = scale.repeat_interleave(rows, 0).repeat_interleave(columns, 1)
    return (w / expanded).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_fp8_checkpoint_runs_as_its_dequantized_weights(tiny_llama_path, tmp_path, scheme):
    scale_name, strategy, config = SCHEMES[scheme]
    tensors = load_file(tiny_llama_path / "model.safetensors")
    quantized, dense = {}, {}
    for name, tensor in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in QUANTIZED:
            weight, scale = quantize(tensor, strategy)
            quantized[name], quantized[name.removesuffix("weight") + scale_name] = weight, scale
            quantized[name.removesuffix("weight") + "input_scale"] = torch.ones(1)  # dropped
            dense[name] = dequantize(weight, scale, BLOCK if strategy == "block" else None)
        else:
            quantized[name] = dense[name] = tensor
    folders = {}
    for kind, weights in (("fp8", quantized), ("dense", dense)):
        folder = folders[kind] = tmp_path / kind
        shutil.copytree(tiny_llama_path, folder)
        (folder / "model.safetensors").unlink()
        names = sorted(weights, reverse=kind == "fp8")  # scales before their weights
        half = len(names) // 2  # two shards: a weight and its scale may lie in either
        for i, part in enumerate((names[:half], names[half:])):
            save_file({n: weights[n].contiguous() for n in part}, folder / f"part-{i}.safetensors")
    config_path = folders["fp8"] / "config.json"
    config_json = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config_json, "quantization_config": config}))

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["hello", "the quick brown fox", "1 2 3"]
    outputs = {}
    for kind, folder in folders.items():
        llm = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None)
        logits = llm.generate(
            prompts, SamplingParams(max_tokens=1, prompt_logprobs=5), use_tqdm=False
        )
        outputs[kind] = (
            [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)],
            [o.prompt_logprobs for o in logits],
        )
    assert outputs["fp8"] == outputs["dense"]
    original = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    assert original.generate(prompts, params, use_tqdm=False)  # the unquantized model runs too


def test_dequantize_layouts():
    weight = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(torch.float8_e4m3fn)
    assert torch.equal(dequantize(weight, torch.tensor([2.0])), weight.float() * 2)
    per_row = dequantize(weight, torch.tensor([[2.0], [3.0]]))
    assert torch.equal(per_row, weight.float() * torch.tensor([[2.0], [3.0]]))
    blocks = dequantize(weight, torch.tensor([[2.0, 3.0]]), (2, 2))  # columns 0-1, then 2
    assert torch.equal(blocks, weight.float() * torch.tensor([[2.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="does not cover"):
        dequantize(weight, torch.ones(3, 3), (2, 2))


def test_other_quantizations_are_refused(tiny_llama_path, tmp_path):
    folder = tmp_path / "gptq"
    shutil.copytree(tiny_llama_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'gptq' checkpoints are not supported"):
        LLM(str(folder), log=lambda m: None)
