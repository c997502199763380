"""Quantized checkpoints (fp8_weights.py, int_weights.py, mxfp4_weights.py): which ones pagedgen
takes, and the stream of their weights, each layer's parts gathered: GPTQ / AWQ layers as
QuantizedWeight (int_weights.py says where not), FP8 and MXFP4 ones dequantized as they stream
in."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader import fp8_weights, int_weights, mxfp4_weights
from pagedgen.loader.file_checks import CheckpointError

# A layer's parts (by part name) and the quantization config -> its weight
WeightOf = Callable[[dict[str, torch.Tensor], dict[str, Any]], torch.Tensor | QuantizedWeight]
METHODS = (*fp8_weights.FP8_METHODS, *int_weights.PACKED_METHODS, *mxfp4_weights.MXFP4_METHODS)


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
            f"{method!r} checkpoints are not supported: pagedgen loads unquantized, GGUF, FP8, "
            f"GPTQ / AWQ and MXFP4 checkpoints ({', '.join(METHODS)})"
        )
    if method in int_weights.PACKED_METHODS:
        int_weights.check_packed(quant)
    elif method in fp8_weights.FP8_METHODS:
        fp8_weights.check_fp8(quant)


def dequantized(
    weights: Iterable[tuple[str, torch.Tensor]], quant: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """The checkpoint's tensors with each quantized layer's parts replaced by its weight: a
    QuantizedWeight where int_weights makes one, else dense."""
    method = quant["quant_method"]
    if method in int_weights.PACKED_METHODS:
        names = int_weights.PARTS[method]

        def part_of(name: str, tensor: torch.Tensor) -> tuple[str, str | None] | None:
            prefix, _, part = name.rpartition(".")
            return (prefix, part) if part in names else None

        return _gathered(weights, part_of, names, names[:3], int_weights.QUANTIZED[method], quant)
    if method in mxfp4_weights.MXFP4_METHODS:
        parts = mxfp4_weights.PARTS
        dequantize = mxfp4_weights.dequantize_parts
        return _gathered(weights, mxfp4_weights.part_of, parts, parts, dequantize, quant, "")
    parts = fp8_weights.PARTS
    return _gathered(
        weights, fp8_weights.part_of, parts, parts, fp8_weights.dequantize_parts, quant
    )


def _gathered(
    weights: Iterable[tuple[str, torch.Tensor]],
    part_of: Callable[[str, torch.Tensor], tuple[str, str | None] | None],
    names: tuple[str, ...],  # a layer's parts
    required: tuple[str, ...],  # those it cannot do without (GPTQ's g_idx may be absent)
    weight_of: WeightOf,
    quant: dict[str, Any],
    suffix: str = ".weight",  # the weight's name: its layer's and this
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """Each layer's parts (part_of: its layer and part name, a None part dropped; None for a
    tensor that passes as it is) gathered wherever in the shards they lie, then its weight."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        where = part_of(name, tensor)
        if where is None:
            yield name, tensor
            continue
        prefix, part = where
        if part is None:
            continue
        found = layers.setdefault(prefix, {})
        found[part] = tensor
        if len(found) == len(names):
            yield f"{prefix}{suffix}", _weight(weight_of, layers.pop(prefix), quant, prefix)
    for prefix, found in layers.items():
        missing = set(required) - set(found)
        if missing:
            raise CheckpointError(f"{prefix} lacks its {sorted(missing)}")
        yield f"{prefix}{suffix}", _weight(weight_of, found, quant, prefix)


def _weight(
    weight_of: WeightOf,
    parts: dict[str, torch.Tensor],
    quant: dict[str, Any],
    prefix: str,
) -> torch.Tensor | QuantizedWeight:
    try:
        return weight_of(parts, quant)
    except ValueError as e:  # a scale or group that does not fit the weight
        raise CheckpointError(f"{prefix}: {e}") from e
