import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.kernels import cpu_gemm_quant_bf16
from pagedgen.layers.linear import Linear, pack_linear_weights
from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader.model_files import load_config, load_tokenizer  # noqa: F401 (re-exported)
from pagedgen.loader.quantized import dequantized, quantization_config
from pagedgen.loader.repacked import Weight, is_repacked, loaded_weights, read_repacked
from pagedgen.loader.resolve import ResolvedModel
from pagedgen.loader.safetensors_files import layer_index, layer_order, read_safetensors
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.registry import get_model_class


def keeps_quantized(model: nn.Module, quantization: str | None, compute_dtype: torch.dtype) -> bool:
    """Whether a linear layer's QuantizedWeight reaches its Linear.load_shard as it is (its
    pack() then computes on it, or dequantizes it where no kernel takes it): with quantization
    int8 or int4 (integers asked for); by default where the model computes in float32, in which
    the integer kernels run faster at every batch, and in bfloat16 where AMX runs quantized weights
    on bfloat16 tiles (cpu_gemm_quant_bf16: the dense path's bits, faster up to 64 rows; Linear.pack
    keeps a bfloat16 layer quantized only where they take all of it); with "none" it is always
    dequantized. Only for a model whose load_weights hands checkpoint tensors to its layers
    unchanged, the Llama family's own: models that transpose, split or reorder tensors as they
    load (GPT-2's Conv1D, fused q/k/v of other layouts) get them dequantized as they stream."""
    if type(model).load_weights is not LlamaForCausalLM.load_weights:
        return False
    if quantization in ("int8", "int4"):
        return True
    bf16_tiles = (
        compute_dtype == torch.bfloat16
        and cpu_gemm_quant_bf16.error() is None
        and cpu_gemm_quant_bf16.on_tiles()
    )
    return quantization is None and (compute_dtype == torch.float32 or bf16_tiles)


def iterate_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors by name, in layer order (see loader/safetensors_files.py): its
    safetensors files, or, where it has none, its PyTorch ones (pytorch_model*.bin, as older
    releases ship: MPT, some BLOOM and OPT forks), read with weights_only, so a pickle can only
    hold tensors."""
    files = _shard_files(folder, "model.safetensors.index.json", "*.safetensors")
    if files:
        yield from read_safetensors([folder / file for file in files])
        return
    files = _shard_files(folder, "pytorch_model.bin.index.json", "pytorch_model*.bin")
    if not files:
        raise FileNotFoundError(
            f"no weights in {folder}: pagedgen loads safetensors, PyTorch .bin or GGUF files"
        )
    states = [
        torch.load(folder / file, map_location="cpu", weights_only=True, mmap=True)
        for file in files
    ]  # (mapped, not read: every shard at once costs no memory)
    items = [item for state in states for item in state.items()]
    del states
    items.sort(key=lambda item: layer_order(item[0]))
    items.reverse()
    while items:  # (popped from the end: a tensor the model has copied is freed)
        yield items.pop()


def packed_as_loaded(
    weights: Iterator[tuple[str, Weight]],
    model: nn.Module,
    compute_dtype: torch.dtype | None,
    quantization: str | None,
    after_layer: Callable[[], object] | None = None,
    outside_layers: bool = True,
) -> Iterator[tuple[str, Weight]]:
    """weights as they stream to the model's load_weights, packing each decoder layer's Linears
    (Linear.pack) as soon as the stream has moved past the layer, and, with outside_layers, a
    Linear outside the layers (an untied LM head) once its tensors have passed, so that a model
    quantized at load never holds more than one layer's dense weights. weights must come in
    layer order (a layer's tensors together, as read_safetensors reads them; a tensor arriving
    for a Linear already packed fails Linear.load_shard's assertion); the Llama family's
    load_weights loads each tensor as it comes. after_layer runs after each group is packed."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    layers: dict[int | None, list[Linear]] = {}
    for name, linear in linears.items():
        if (index := layer_index(name + ".")) is not None:
            layers.setdefault(index, []).append(linear)
    current: int | None = None
    for name, weight in weights:
        index = layer_index(name)
        if index != current:  # load_weights has loaded all of the group before
            packed = layers.pop(current, [])
            for linear in packed:
                linear.pack(compute_dtype, quantization)
            if packed and after_layer is not None:
                after_layer()
            current = index
        if (
            outside_layers
            and index is None
            and (outside := linears.get(name.removeprefix("model.").rpartition(".")[0]))
        ):
            layers.setdefault(None, []).append(outside)
        yield name, weight


def _shard_files(folder: Path, index_name: str, pattern: str) -> list[str]:
    index = folder / index_name
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return sorted(p.name for p in folder.glob(pattern))


def checkpoint_weights(
    resolved: ResolvedModel, config: PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """The checkpoint's weights by Hugging Face name: a QuantizedWeight for each one kept
    quantized (a GGUF file's, GPTQ / AWQ layers in plain groups), else dense."""
    if resolved.gguf_file:
        from pagedgen.loader.gguf import gguf_weights

        return gguf_weights(resolved.path / resolved.gguf_file, config)
    weights = iterate_weights(resolved.path)
    if is_repacked(resolved.path):
        return read_repacked(resolved.path, weights)
    quant = quantization_config(config)
    return weights if quant is None else dequantized(weights, quant)


def load_model(
    resolved: ResolvedModel,
    config: PretrainedConfig,
    backend: AttentionBackend,
    max_position: int,
    dtype: torch.dtype,
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
    quantization: str | None = None,  # EngineConfig's: see Linear.pack
    after_layer: Callable[[], object] | None = None,  # see packed_as_loaded
) -> nn.Module:
    """Builds our own implementation of the checkpoint's architecture and loads its weights in
    dtype; a compute_dtype other than dtype (float32 for a half-precision model on a CPU without
    a native half matmul) then widens them, keeping dtype's values."""
    model_cls = get_model_class(config)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters in dtype; the rotary table stays float32
    try:
        with torch.device(device):
            model = model_cls(config, backend, max_position)
    finally:
        torch.set_default_dtype(default_dtype)
    keep = keeps_quantized(model, quantization, compute_dtype or dtype)
    weights = loaded_weights(checkpoint_weights(resolved, config), model, dtype, keep)
    if resolved.gguf_file is None and type(model).load_weights is LlamaForCausalLM.load_weights:
        # (a model whose derived weights read its LM head, a classifier's score rows, packs it last)
        head_read = type(model).derived_weights is not LlamaForCausalLM.derived_weights
        weights = packed_as_loaded(
            weights, model, compute_dtype, quantization, after_layer, not head_read
        )
    model.load_weights(weights)
    # before the widening: panels stay bfloat16
    pack_linear_weights(model, compute_dtype, quantization)
    if compute_dtype is not None and compute_dtype != dtype:
        model.to(compute_dtype)
    return model.eval()
