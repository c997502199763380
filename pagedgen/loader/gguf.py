import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from pagedgen.models.registry import get_model_class


def read_gguf(
    path: Path, config: PretrainedConfig | None = None
) -> tuple[PretrainedConfig, dict[str, torch.Tensor]]:
    """Dequantizes a GGUF file into float32 tensors under their Hugging Face names.

    transformers does the format work (metadata to config, llama.cpp's q/k permutation undone);
    a weightless model on the meta device only supplies the name mapping.
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = config or read_gguf_config(path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    return config, parsed["tensors"]


def read_gguf_config(path: Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized; nothing stays quantized
    return config


def convert_gguf(path: Path, target: Path) -> None:
    """Writes an HF folder (config, tokenizer, model.safetensors) for a GGUF file, atomically.
    An architecture we do not implement is refused after reading the metadata only."""
    config = read_gguf_config(path)
    get_model_class(config)
    config, tensors = read_gguf(path, config)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        save_file({k: v.contiguous() for k, v in tensors.items()}, staging / "model.safetensors")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
