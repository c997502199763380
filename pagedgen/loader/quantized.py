"""Quantized checkpoints, dequantized as their tensors stream in (fp8_weights.py, int_weights.py):
which ones pagedgen takes, and the stream of dense weights a model's load_weights reads."""

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pagedgen.loader import fp8_weights, int_weights

METHODS = (*fp8_weights.FP8_METHODS, *int_weights.PACKED_METHODS)


def quantization_config(config: Any) -> dict[str, Any] | None:
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    return quant if isinstance(quant, dict) else quant.to_dict()


def check_quantization(config: Any) -> None:
    """Raises ValueError for a quantized checkpoint pagedgen cannot load."""
    quant = quantization_config(config)
    if quant is None:
        return
    method = quant.get("quant_method")
    if method not in METHODS:
        raise ValueError(
            f"{method!r} checkpoints are not supported: pagedgen loads unquantized, GGUF, FP8 "
            f"and GPTQ / AWQ checkpoints ({', '.join(METHODS)})"
        )
    if method in int_weights.PACKED_METHODS:
        int_weights.check_packed(quant)
    else:
        fp8_weights.check_fp8(quant)


def dequantized(
    weights: Iterable[tuple[str, torch.Tensor]], quant: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    if quant["quant_method"] in int_weights.PACKED_METHODS:
        return _packed(weights, quant)
    return fp8_weights.dequantized(weights, quant)


def _packed(
    weights: Iterable[tuple[str, torch.Tensor]], quant: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each layer's parts gathered wherever in the shards they lie, then its dense weight."""
    method = quant["quant_method"]
    names, dequantize = int_weights.PARTS[method], int_weights.DEQUANTIZE[method]
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in names:
            yield name, tensor
            continue
        parts = layers.setdefault(prefix, {})
        parts[part] = tensor
        if len(parts) == len(names):
            yield f"{prefix}.weight", dequantize(layers.pop(prefix), quant)
    for prefix, parts in layers.items():  # GPTQ without g_idx: groups in order
        missing = set(names[:3]) - set(parts)
        if missing:
            raise ValueError(f"{prefix} lacks its {sorted(missing)}")
        yield f"{prefix}.weight", dequantize(parts, quant)
