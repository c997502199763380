"""Loading a checkpoint's tensors, by their Hugging Face names, into a model whose q/k/v and
gate/up projections are fused."""

from collections.abc import Callable, Iterable

import torch
from torch import nn

from pagedgen.layers.linear import Linear, load_param
from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.models.kv_scales import kv_scale_of, scale_value

# checkpoint projection -> (our fused module, shard index)
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def fused_module(module_name: str) -> tuple[str, int | None]:
    """Our module for a checkpoint's (its "model." prefix dropped): for a q/k/v or gate/up
    projection, the fused one and the shard it loads into; else the same name and None."""
    name = module_name.removeprefix("model.")
    prefix, _, proj = name.rpartition(".")
    if proj in STACKED_PARAMS:
        fused, shard = STACKED_PARAMS[proj]
        return f"{prefix}.{fused}", shard
    return name, None


def load_checkpoint_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    derived_weights: Callable[[], set[str]],  # sets the parameters computed from loaded ones
) -> None:
    """Loads every tensor into its parameter (a fused projection's shard, a KV scale's
    attribute); an untied LM head takes the embedding when the checkpoint has none (its
    QuantizedWeight where loaded_weights kept one). Raises
    ValueError for a tensor the model has no place for, or a parameter left unset."""
    modules = dict(model.named_modules())
    names = {name for name, _ in model.named_parameters()}
    # (not the Linears': a layer packed as it loads frees its dense weight)
    params = {
        f"{prefix}{'.' if prefix else ''}{name}": param
        for prefix, module in modules.items()
        if not isinstance(module, Linear)
        for name, param in module.named_parameters(recurse=False)
    }
    loaded: set[str] = set()
    embed = embed_quantized = None
    for name, tensor in weights:
        name = name.removeprefix("model.")
        if "rotary_emb" in name:
            continue
        if (kv_scale := kv_scale_of(name)) is not None:  # set, not a parameter
            setattr(modules[kv_scale[0]], kv_scale[1], scale_value(name, tensor))
            continue
        module_name, _, param_name = name.rpartition(".")
        target, shard = fused_module(module_name)
        if shard is not None and target in modules:  # (MLA's q_proj is its own)
            modules[target].load_shard(param_name, tensor, shard)
            loaded.add(f"{target}.{param_name}")
        elif isinstance(modules.get(module_name), Linear):  # fused or not in the checkpoint
            modules[module_name].load_shard(param_name, tensor, None)
            loaded.add(name)
        elif name in params:
            if isinstance(tensor, QuantizedWeight):  # an embedding kept for a tied LM head
                embed_quantized, tensor = tensor, tensor.dequantize().to(params[name].dtype)
            load_param(params[name], tensor)
            loaded.add(name)
            if name == "embed_tokens.weight":  # (the parameter: the tensor may be freed)
                embed = params[name].data
        else:
            raise ValueError(f"unexpected weight {name!r} in the checkpoint")
    if "lm_head.weight" not in loaded and embed is not None:
        modules["lm_head"].load_shard(
            "weight", embed if embed_quantized is None else embed_quantized
        )
        loaded.add("lm_head.weight")
    loaded |= derived_weights()
    missing = sorted(names - loaded)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")
