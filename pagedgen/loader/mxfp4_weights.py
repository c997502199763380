"""MXFP4 checkpoints (OpenAI's gpt-oss: quant_method "mxfp4"), dequantized as they load. Each
expert tensor comes as <name>_blocks, 4-bit E2M1 floats two to a byte (the low nibble first),
32 a block, and <name>_scales, one E8M0 exponent (2 ** (byte - 127)) a block; transformers'
convert_moe_packed_tensors makes the dense [experts, in, out] tensor the unquantized checkpoint
holds, in bfloat16 (exact: an E2M1 value times a power of two). They run as that checkpoint
would: the memory of the model's dtype, none of MXFP4's speed."""

from typing import Any

import torch

MXFP4_METHODS = ("mxfp4",)
PARTS = ("blocks", "scales")


def part_of(name: str, tensor: torch.Tensor) -> tuple[str, str | None] | None:
    """(the dense tensor's name, "blocks" or "scales") for a quantized part, else None."""
    stem, _, part = name.rpartition("_")
    return (stem, part) if stem and part in PARTS else None


def dequantize_parts(parts: dict[str, torch.Tensor], quant: dict[str, Any]) -> torch.Tensor:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(parts["blocks"], parts["scales"], dtype=torch.bfloat16)
