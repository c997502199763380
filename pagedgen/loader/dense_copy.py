"""A dense copy of a folder of quantized weights (a converted GGUF file), for the tools that read
Hugging Face folders themselves (the vLLM baseline): made once beside it, each quantized weight
dequantized to float32, as transformers reads the GGUF file (the default model: 517 MB)."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader.repacked import (
    QUANTIZED_WEIGHTS,
    is_repacked,
    read_repacked,
    write_safetensors,
)
from pagedgen.loader.weights import iterate_weights


def dense_folder(folder: Path) -> Path:
    """folder itself where its weights are dense; else its dense copy, made if missing."""
    if not is_repacked(folder):
        return folder
    target = folder.with_name(f"{folder.name}-dense")
    if (target / "model.safetensors").is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".dense-", dir=folder.parent))
    try:
        for file in folder.iterdir():
            if file.is_file() and file.name not in ("model.safetensors", QUANTIZED_WEIGHTS):
                shutil.copy2(file, staging / file.name)
        write_safetensors(_dense(folder), staging / "model.safetensors")
        if not (target / "model.safetensors").is_file():  # else made meanwhile, by another
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _dense(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for name, weight in read_repacked(folder, iterate_weights(folder)):
        yield name, weight.dequantize() if isinstance(weight, QuantizedWeight) else weight
