"""Quantized checkpoints load dequantized: FP8 per-tensor, per-channel and block scales (the
layouts of compressed-tensors, transformers' "fp8" and "fbgemm_fp8") and GPTQ / AWQ packed
integers give exactly the engine a checkpoint of the dequantized weights gives; what cannot be
unpacked is refused before anything loads."""

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


def assert_runs_as_dense(tiny_llama_path, tmp_path, quantized, dense, quantization_config):
    """Writes the quantized tensors (over two shards, in an order that puts some parts of a
    layer before others) with quantization_config, and the dense ones as a plain checkpoint;
    both engines must give the same greedy tokens and prompt logprobs."""
    folders = {}
    for kind, weights in (("quantized", quantized), ("dense", dense)):
        folder = folders[kind] = tmp_path / kind
        shutil.copytree(tiny_llama_path, folder)
        (folder / "model.safetensors").unlink()
        names = sorted(weights, reverse=kind == "quantized")
        half = len(names) // 2  # two shards: a weight and its scale may lie in either
        for i, part in enumerate((names[:half], names[half:])):
            save_file({n: weights[n].contiguous() for n in part}, folder / f"part-{i}.safetensors")
    config_path = folders["quantized"] / "config.json"
    config_json = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config_json, "quantization_config": quantization_config}))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    scoring = SamplingParams(max_tokens=1, prompt_logprobs=5)
    prompts = ["hello", "the quick brown fox", "1 2 3"]
    outputs = {}
    runs = [("dense", folders["dense"], None), ("quantized", folders["quantized"], "none")]
    runs.append(("native", folders["quantized"], None))  # its integers as they are, on a CPU
    for kind, folder, quantization in runs:
        llm = LLM(str(folder), kv_cache_memory=0.01, quantization=quantization, log=lambda m: None)
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        scores = [o.prompt_logprobs for o in llm.generate(prompts, scoring, use_tqdm=False)]
        outputs[kind] = tokens, scores
    assert outputs["quantized"] == outputs["dense"]  # dequantized: the dense model's bits
    errors = [  # int8 activations: each prompt token's logprob near the dense model's
        abs(step[token].logprob - reference[token].logprob)
        for native, dense in zip(outputs["native"][1], outputs["dense"][1])
        for step, reference in zip(native[1:], dense[1:])
        for token in [next(iter(reference))]  # the prompt token, first
    ]
    assert sum(errors) / len(errors) < 0.3 and max(errors) < 1.5, errors  # int8 online: 0.21


def quantized_layers(tiny_llama_path, quantize_layer):
    """(quantized tensors, dense tensors): quantize_layer(name, weight) gives a layer's parts by
    name suffix and its dense weight; every other tensor is kept as it is."""
    quantized, dense = {}, {}
    for name, tensor in load_file(tiny_llama_path / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in QUANTIZED:
            parts, dense[name] = quantize_layer(tensor)
            prefix = name.removesuffix("weight")
            quantized.update({prefix + suffix: part for suffix, part in parts.items()})
        else:
            quantized[name] = dense[name] = tensor
    return quantized, dense


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_fp8_checkpoint_runs_as_its_dequantized_weights(tiny_llama_path, tmp_path, scheme):
    scale_name, strategy, config = SCHEMES[scheme]
    block = BLOCK if strategy == "block" else None

    def quantize_layer(tensor):
        weight, scale = quantize(tensor, strategy)
        parts = {"weight": weight, scale_name: scale, "input_scale": torch.ones(1)}  # dropped
        return parts, dequantize(weight, scale, block)

    quantized, dense = quantized_layers(tiny_llama_path, quantize_layer)
    assert_runs_as_dense(tiny_llama_path, tmp_path, quantized, dense, config)


def int_quantize(weight: torch.Tensor, bits: int, group_size: int, g_idx: torch.Tensor):
    """Asymmetric integer quantization of weight [out, in] per group of input rows (g_idx: each
    row's group): q [in, out], zeros and float16 scales [groups, out], and the dense weight."""
    w = weight.float().t()  # [in, out]
    groups = int(g_idx.max()) + 1
    low = torch.stack([w[g_idx == g].amin(0) for g in range(groups)])
    high = torch.stack([w[g_idx == g].amax(0) for g in range(groups)])
    scales = ((high - low) / (2**bits - 1)).clamp(min=1e-6).half()
    zeros = (-low / scales.float()).round().clamp(0, 2**bits - 1).int()
    q = (w / scales.float()[g_idx]).round().int() + zeros[g_idx]
    q = q.clamp(0, 2**bits - 1)
    dense = ((q - zeros[g_idx]).float() * scales.float()[g_idx]).t()
    return q, zeros, scales, dense


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's qweight: 32 // bits consecutive rows in a word, the first in the low bits."""
    pack = 32 // bits
    words = torch.zeros(values.shape[0] // pack, values.shape[1], dtype=torch.int32)
    for row in range(words.shape[0]):
        for j in range(pack):
            words[row] |= values[row * pack + j].int() << (bits * j)
    return words


def pack_columns(values: torch.Tensor, bits: int, order: list[int] | None = None) -> torch.Tensor:
    """Consecutive columns in a word: word bits [bits * i, ...) hold column order[i] of its run
    (AutoAWQ's pack with order [0, 2, 4, 6, 1, 3, 5, 7]; GPTQ's qzeros in plain order)."""
    pack = 32 // bits
    order = order or list(range(pack))
    words = torch.zeros(values.shape[0], values.shape[1] // pack, dtype=torch.int32)
    for column in range(words.shape[1]):
        for i in range(pack):
            words[:, column] |= values[:, column * pack + order[i]].int() << (bits * i)
    return words


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_gptq_checkpoint_runs_as_its_dequantized_weights(
    tiny_llama_path, tmp_path, bits, checkpoint_format
):
    """Groups of 32 input rows, listed out of order in g_idx (desc_act), zero points stored less
    one in the "gptq" format and as they are in "gptq_v2"."""
    generator = torch.Generator().manual_seed(bits)

    def quantize_layer(tensor):
        in_features = tensor.shape[1]
        g_idx = (torch.arange(in_features) // 32)[torch.randperm(in_features, generator=generator)]
        q, zeros, scales, dense = int_quantize(tensor, bits, 32, g_idx)
        stored = zeros - 1 if checkpoint_format == "gptq" else zeros
        parts = {
            "qweight": pack_rows(q, bits),
            "qzeros": pack_columns(stored & (2**bits - 1), bits),
            "scales": scales,
            "g_idx": g_idx.int(),
        }
        return parts, dense

    quantized, dense = quantized_layers(tiny_llama_path, quantize_layer)
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": 32,
        "desc_act": True,
        "sym": False,
        "checkpoint_format": checkpoint_format,
    }
    assert_runs_as_dense(tiny_llama_path, tmp_path, quantized, dense, config)


def test_awq_checkpoint_runs_as_its_dequantized_weights(tiny_llama_path, tmp_path):
    def quantize_layer(tensor):
        g_idx = torch.arange(tensor.shape[1]) // 32
        q, zeros, scales, dense = int_quantize(tensor, 4, 32, g_idx)
        order = [0, 2, 4, 6, 1, 3, 5, 7]
        parts = {
            "qweight": pack_columns(q, 4, order),
            "qzeros": pack_columns(zeros, 4, order),
            "scales": scales,
        }
        return parts, dense

    quantized, dense = quantized_layers(tiny_llama_path, quantize_layer)
    config = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    assert_runs_as_dense(tiny_llama_path, tmp_path, quantized, dense, config)


def int8_config(strategy: str, group_size: int | None) -> dict:
    """compressed-tensors' config for W8A8 int8 (llm-compressor's scheme "W8A8")."""
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": strategy,
               "group_size": group_size, "dynamic": False}  # fmt: skip
    activations = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor"}
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations}
        },  # fmt: skip
        "ignore": ["lm_head"],
    }


@pytest.mark.parametrize("strategy", ["channel", "tensor", "group"])
def test_int8_compressed_tensors_checkpoint_runs_as_its_dequantized_weights(
    tiny_llama_path, tmp_path, strategy
):
    """int8 weights with per-channel, per-tensor or per-group float16 scales become
    QuantizedWeight (8 bits, one group a row or 32 inputs); the static input scale is dropped."""
    from pagedgen.layers.quantized_weight import QuantizedWeight
    from pagedgen.loader.fp8_weights import dequantize_parts

    group_size = 32 if strategy == "group" else None

    def quantize_layer(tensor):
        w = tensor.float()
        groups = w.unflatten(1, (-1, group_size or w.shape[1]))
        if strategy == "tensor":
            groups = w.reshape(1, 1, -1)
        scale = (groups.abs().amax(-1) / 127).half()  # [out, groups] or [1, 1]
        expanded = scale.float().repeat_interleave(w.numel() // scale.numel(), -1)
        q = (w.reshape(expanded.shape) / expanded).round().clamp(-127, 127)
        q = q.to(torch.int8).reshape(w.shape)
        if strategy == "tensor":
            scale = scale.reshape(1)
        parts = {"weight": q, "weight_scale": scale, "input_scale": torch.ones(1)}
        weight = dequantize_parts({"weight": q, "scale": scale}, config)
        assert isinstance(weight, QuantizedWeight) and weight.bits == 8
        assert weight.group_size == (group_size or w.shape[1])
        assert weight.int8_activations  # W8A8
        return parts, weight.dequantize()

    config = int8_config(strategy, group_size)
    quantized, dense = quantized_layers(tiny_llama_path, quantize_layer)
    assert_runs_as_dense(tiny_llama_path, tmp_path, quantized, dense, config)


def test_w8a16_int8_weights_compute_against_wider_activations():
    from pagedgen.loader.fp8_weights import dequantize_parts

    config = int8_config("channel", None)
    parts = {"weight": torch.ones(4, 32, dtype=torch.int8), "scale": torch.ones(4)}
    assert dequantize_parts(parts, config).int8_activations
    del config["config_groups"]["group_0"]["input_activations"]
    assert not dequantize_parts(parts, config).int8_activations


def test_dequantize_layouts():
    weight = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(torch.float8_e4m3fn)
    assert torch.equal(dequantize(weight, torch.tensor([2.0])), weight.float() * 2)
    per_row = dequantize(weight, torch.tensor([[2.0], [3.0]]))
    assert torch.equal(per_row, weight.float() * torch.tensor([[2.0], [3.0]]))
    blocks = dequantize(weight, torch.tensor([[2.0, 3.0]]), (2, 2))  # columns 0-1, then 2
    assert torch.equal(blocks, weight.float() * torch.tensor([[2.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="does not cover"):
        dequantize(weight, torch.ones(3, 3), (2, 2))


def test_what_cannot_be_unpacked_is_refused(tiny_llama_path, tmp_path):
    folder = tmp_path / "gptq"
    shutil.copytree(tiny_llama_path, folder)
    config = json.loads((folder / "config.json").read_text())
    for quant, match in (
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes' checkpoints"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "unpacks 2, 4 and 8 bits"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "GEMM layout only"),
        ({**int8_config("channel", None), "format": "pack-quantized"}, "int-quantized"),
    ):
        config["quantization_config"] = quant
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=match):
            LLM(str(folder), log=lambda m: None)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_gptq_layers_are_quantized_weights_of_the_same_values(bits, checkpoint_format):
    """Plain groups become a QuantizedWeight (2 and 4 bits in nibbles, 8 as q - 128) whose
    dequantize() is the dense weight bit for bit; groups act-order scatters stay dense."""
    from pagedgen.layers.quantized_weight import QuantizedWeight
    from pagedgen.loader.int_weights import dequantize_gptq, quantized_gptq

    generator = torch.Generator().manual_seed(bits)
    weight = torch.randn(48, 128, generator=generator)
    quant = {"quant_method": "gptq", "bits": bits, "group_size": 32,
             "checkpoint_format": checkpoint_format}  # fmt: skip
    for g_idx, kept in (
        (torch.arange(128) // 32, True),
        ((torch.arange(128) // 32)[torch.randperm(128, generator=generator)], False),
    ):
        q, zeros, scales, dense = int_quantize(weight, bits, 32, g_idx)
        stored = zeros - 1 if checkpoint_format == "gptq" else zeros
        parts = {"qweight": pack_rows(q, bits), "scales": scales, "g_idx": g_idx.int(),
                 "qzeros": pack_columns(stored & (2**bits - 1), bits)}  # fmt: skip
        got = quantized_gptq(parts, quant)
        assert isinstance(got, QuantizedWeight) == kept
        if kept:
            assert (got.bits, got.group_size) == (4 if bits < 8 else 8, 32)
            got = got.dequantize()
        assert torch.equal(got, dequantize_gptq(parts, quant)) and torch.equal(got, dense)


def test_awq_layers_are_quantized_weights_of_the_same_values():
    from pagedgen.loader.int_weights import dequantize_awq, quantized_awq

    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(0))
    q, zeros, scales, dense = int_quantize(weight, 4, 32, torch.arange(128) // 32)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    parts = {"qweight": pack_columns(q, 4, order), "qzeros": pack_columns(zeros, 4, order),
             "scales": scales}  # fmt: skip
    quant = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    got = quantized_awq(parts, quant)
    assert (got.bits, got.group_size) == (4, 32)
    assert torch.equal(got.dequantize(), dequantize_awq(parts, quant))
    assert torch.equal(got.dequantize(), dense)


def test_which_models_keep_their_integers():
    from pagedgen.kernels import cpu_gemm_quant_bf16
    from pagedgen.loader.weights import keeps_quantized
    from pagedgen.models.gpt2 import GPT2LMHeadModel
    from pagedgen.models.llama import LlamaForCausalLM

    llama = LlamaForCausalLM.__new__(LlamaForCausalLM)
    assert keeps_quantized(llama, None, torch.float32)  # the integer kernels win in float32
    # in bfloat16 where AMX takes 4-bit weights on bfloat16 tiles (the dense bits), else dense
    tiles = cpu_gemm_quant_bf16.error() is None and cpu_gemm_quant_bf16.on_tiles()
    assert keeps_quantized(llama, None, torch.bfloat16) == tiles
    assert keeps_quantized(llama, "int4", torch.bfloat16)  # asked for
    assert not keeps_quantized(llama, "none", torch.float32)
    gpt2 = GPT2LMHeadModel.__new__(GPT2LMHeadModel)  # transposes its Conv1D weights as they load
    assert not keeps_quantized(gpt2, "int8", torch.float32)
