"""Reading a PEFT LoRA adapter folder: adapter_config.json and its A/B matrices."""

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from pagedgen.layers.lora import LoRAWeights

PREFIX = "base_model.model."  # PEFT's wrapper around the model's own module names


def load_adapter(path: str | Path, max_rank: int) -> dict[str, LoRAWeights]:
    """The adapter's weights by the model's module name (e.g. model.layers.0.self_attn.q_proj),
    as float32 on the CPU; raises ValueError for what pagedgen cannot run exactly."""
    path = Path(path)
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a LoRA adapter folder: it has no adapter_config.json")
    config = json.loads(config_file.read_text())
    _check_config(config, path)
    rank = int(config["r"])
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {path} has rank {rank}, above max_lora_rank ({max_rank})")
    alpha = float(config.get("lora_alpha") or rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = _load_tensors(path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(PREFIX)
        module, _, kind = name.rpartition(".")  # kind: "weight"
        module, _, matrix = module.rpartition(".")
        if kind != "weight" or matrix not in ("lora_A", "lora_B"):
            raise ValueError(f"LoRA adapter {path}: unsupported tensor {key!r}")
        pairs.setdefault(module, {})[matrix] = tensor.float()
    weights = {}
    for module, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter {path}: {module} lacks lora_A or lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(f"LoRA adapter {path}: {module}'s matrices are not of rank {rank}")
        weights[module] = LoRAWeights(a, b, scaling)
    if not weights:
        raise ValueError(f"LoRA adapter {path} holds no LoRA weights")
    return weights


def _check_config(config: dict, path: Path) -> None:
    refused = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
        "modules_to_save": "modules_to_save (whole replaced modules)",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "lora_bias": "a bias on lora_B",
    }
    for field, what in refused.items():
        if config.get(field):
            raise ValueError(f"LoRA adapter {path} uses {what}, which pagedgen does not support")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path} is a {config['peft_type']} adapter, not LoRA")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {path} trains biases (bias={config['bias']!r})")


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if (path / "adapter_model.safetensors").is_file():
        return load_file(path / "adapter_model.safetensors")
    if (path / "adapter_model.bin").is_file():
        return torch.load(path / "adapter_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"LoRA adapter {path} has no adapter_model.safetensors or .bin")
