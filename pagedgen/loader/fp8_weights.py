"""FP8 checkpoints (compressed-tensors "float-quantized", transformers' "fp8" and "fbgemm_fp8"),
dequantized as they load: each float8 weight times its scale (one per tensor, per output
channel, or per block of weight_block_size), in float32, then the model's dtype. They run as a
checkpoint of those dense weights would: the memory of the model's dtype, none of FP8's speed.
Activation scales (input_scale) are dropped: activations run unquantized. KV-cache scales
(k_scale, v_scale) pass to the model (models/kv_scales.py).

compressed-tensors' 8-bit integer weights ("int-quantized": W8A8 and W8A16 int8, symmetric)
gather the same way into a QuantizedWeight: bits 8, one group a row (per-channel or per-tensor
scales) or the checkpoint's groups; W8A8's (8-bit integer input_activations) compute against
int8 activations, quantized as they come (its static input scales are dropped)."""

from typing import Any

import torch

from pagedgen.attention.kv_cache_dtype import is_fp8
from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.models.kv_scales import kv_scale_of

FP8_METHODS = ("compressed-tensors", "fp8", "fbgemm_fp8")
PARTS = ("weight", "scale")
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv")  # the latter multiplies too (DeepSeek's)
DROPPED_SUFFIXES = (".input_scale", ".input_scale_ub", ".output_scale")


INT8_FORMATS = (None, "int-quantized")  # compressed-tensors' formats of plain int8 tensors


def check_fp8(quant: dict[str, Any]) -> None:
    """Raises ValueError for a compressed-tensors checkpoint of other than 8-bit float weights
    or symmetric 8-bit integer weights stored as int8 tensors."""
    for name, group in (quant.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        fmt = group.get("format") or quant.get("format")
        float8 = weights.get("type") == "float"
        int8 = weights.get("type") == "int" and weights.get("symmetric", True)
        if weights.get("num_bits") != 8 or not (float8 or (int8 and fmt in INT8_FORMATS)):
            raise ValueError(
                f"compressed-tensors group {name!r} quantizes weights to {weights} "
                f"(format {fmt!r}): pagedgen loads 8-bit float and symmetric 8-bit integer "
                "(int-quantized) weights of it only"
            )


def block_size_of(quant: dict[str, Any]) -> tuple[int, int] | None:
    """The [rows, columns] a block scale covers, where the checkpoint says."""
    if quant.get("weight_block_size"):
        return tuple(quant["weight_block_size"])
    for group in (quant.get("config_groups") or {}).values():
        block = (group.get("weights") or {}).get("block_structure")
        if block:
            return tuple(block)
    return None


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None
) -> torch.Tensor:
    """A float8 weight [out, in] times its scale: one number, [out] or [out, 1] per channel, or
    [ceil(out / rows), ceil(in / columns)] per block (the block from the checkpoint, else as the
    scale's shape implies)."""
    out_features, in_features = weight.shape
    scale = scale.float()
    if scale.numel() == 1:
        return weight.float() * scale.reshape(())
    if tuple(scale.shape) in ((out_features,), (out_features, 1)):
        return weight.float() * scale.reshape(out_features, 1)
    if scale.dim() != 2:
        raise ValueError(
            f"a scale of shape {tuple(scale.shape)} for a weight {tuple(weight.shape)}"
        )
    rows, columns = block or (-(-out_features // scale.shape[0]), -(-in_features // scale.shape[1]))
    if scale.shape != (-(-out_features // rows), -(-in_features // columns)):
        raise ValueError(
            f"a block scale of shape {tuple(scale.shape)} does not cover a weight of shape "
            f"{tuple(weight.shape)} in blocks of {rows}x{columns}"
        )
    expanded = scale.repeat_interleave(rows, 0).repeat_interleave(columns, 1)
    return weight.float() * expanded[:out_features, :in_features]


def part_of(name: str, tensor: torch.Tensor) -> tuple[str, str | None] | None:
    """(layer, "weight" or "scale") of a quantized layer's tensor; a None part for an activation
    scale, dropped; None for any other tensor, which loads as it is (KV scales included)."""
    if kv_scale_of(name) is not None:
        return None
    if name.endswith(DROPPED_SUFFIXES):
        return name.rpartition(".")[0], None
    for suffix in SCALE_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix), "scale"
    if name.endswith(".weight") and (is_fp8(tensor.dtype) or tensor.dtype == torch.int8):
        return name.removesuffix(".weight"), "weight"
    return None


def dequantize_parts(
    parts: dict[str, torch.Tensor], quant: dict[str, Any]
) -> torch.Tensor | QuantizedWeight:
    if parts["weight"].dtype == torch.int8:
        return int8_weight(parts["weight"], parts["scale"], is_w8a8(quant))
    return dequantize(parts["weight"], parts["scale"], block_size_of(quant))


def is_w8a8(quant: dict[str, Any]) -> bool:
    """Whether a compressed-tensors config quantizes activations to 8-bit integers (W8A8)."""
    groups = (quant.get("config_groups") or {}).values()
    activations = [group.get("input_activations") or {} for group in groups]
    return bool(activations) and all(
        a.get("type") == "int" and a.get("num_bits") == 8 for a in activations
    )


def int8_weight(
    weight: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False
) -> QuantizedWeight:
    """An int8 weight [out, in] and its scale (one number, [out] or [out, 1] per channel, or
    [out, groups]) as a QuantizedWeight; int8_activations: made for them (W8A8)."""
    out_features, in_features = weight.shape
    scale = scale.float()
    if scale.numel() == 1 or tuple(scale.shape) == (out_features,):
        scale = scale.reshape(-1, 1).expand(out_features, 1)
    if scale.dim() != 2 or scale.shape[0] != out_features or in_features % scale.shape[1]:
        raise ValueError(
            f"a scale of shape {tuple(scale.shape)} for an int8 weight {tuple(weight.shape)}"
        )
    group_size = in_features // scale.shape[1]
    return QuantizedWeight(8, group_size, weight, scale.contiguous(), None, int8_activations)
