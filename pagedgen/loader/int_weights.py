"""GPTQ and AWQ checkpoints: each layer's packed integer weights, zero points and group scales
become a QuantizedWeight (zero points as mins, -zero * scale; 2 and 4 bits in nibbles, 8 bits as
q - 128 with min (128 - zero) * scale), or, where GPTQ's g_idx scatters a group's inputs
(act-order, desc_act: no group size describes them), one dense weight in float32. With float16
or bfloat16 scales, as the formats store them, q * scale + min is (q - zero) * scale bit for bit:
both products and their sum are exact in float32.

Layouts (int32 words, value i of a word in bits [bits * i, bits * (i + 1))):
  GPTQ  qweight [in / pack, out], packed along in; qzeros [groups, out / pack], packed along out,
        each stored less 1 (checkpoint_format "gptq"; "gptq_v2" stores them as they are);
        scales [groups, out]; g_idx [in], the group of each input row (i // group_size without).
  AWQ   (version "gemm") qweight [in, out / 8] and qzeros [in / group_size, out / 8], both
        packed along out in the order 0, 2, 4, 6, 1, 3, 5, 7; scales [in / group_size, out].
  weight[o, i] = (q[i, o] - zero[group(i), o]) * scale[group(i), o]
"""

from typing import Any

import torch

from pagedgen.layers.quantized_weight import QuantizedWeight, pack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column each nibble of an AWQ word holds
PACKED_METHODS = ("gptq", "awq")


def unpack(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> their 32 // bits unsigned values each, laid out along dim (0 or 1)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    if dim == 0:  # [rows, cols] -> [rows * pack, cols]
        values = (words[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
        return values.reshape(-1, words.shape[1])
    values = (words[:, :, None] >> shifts[None, None, :]) & ((1 << bits) - 1)
    return values.reshape(words.shape[0], -1)


def quantized_gptq(
    parts: dict[str, torch.Tensor], quant: dict[str, Any]
) -> QuantizedWeight | torch.Tensor:
    """The layer as a QuantizedWeight; dense where g_idx is not plain groups of consecutive
    inputs, or the groups do not divide the inputs (a last group cut short)."""
    bits, q, zeros = _gptq_values(parts, quant)
    in_features = q.shape[0]
    group_size = _group_size(quant, in_features)
    g_idx = parts.get("g_idx")
    plain = g_idx is None or torch.equal(g_idx.long(), torch.arange(in_features) // group_size)
    if not plain or in_features % group_size:
        return dequantize_gptq(parts, quant)
    return _quantized(q, zeros, parts["scales"], bits, group_size)


def quantized_awq(
    parts: dict[str, torch.Tensor], quant: dict[str, Any]
) -> QuantizedWeight | torch.Tensor:
    q, zeros = _awq_values(parts)
    group_size = _group_size(quant, q.shape[0])
    if q.shape[0] % group_size:
        return dequantize_awq(parts, quant)
    return _quantized(q, zeros, parts["scales"], 4, group_size)


def _quantized(
    q: torch.Tensor,  # [in, out], 0 .. 2**bits - 1
    zeros: torch.Tensor,  # [groups, out]
    scales: torch.Tensor,  # [groups, out]
    bits: int,
    group_size: int,
) -> QuantizedWeight:
    scales = scales.float().t().contiguous()
    zeros = zeros.t()
    if bits <= 4:
        return QuantizedWeight(4, group_size, pack_int4(q.t()), scales, -zeros * scales)
    values = (q.t() - 128).to(torch.int8).contiguous()
    return QuantizedWeight(8, group_size, values, scales, (128 - zeros) * scales)


def _gptq_values(
    parts: dict[str, torch.Tensor], quant: dict[str, Any]
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(bits, q [in, out], zero points [groups, out])."""
    bits = quant.get("bits", 4)
    q = unpack(parts["qweight"], bits, 0)  # [in, out]
    zeros = unpack(parts["qzeros"], bits, 1)[:, : q.shape[1]]  # [groups, out]
    if quant.get("checkpoint_format", "gptq") == "gptq":
        zeros = zeros + 1
    return bits, q, zeros


def dequantize_gptq(parts: dict[str, torch.Tensor], quant: dict[str, Any]) -> torch.Tensor:
    _, q, zeros = _gptq_values(parts, quant)
    g_idx = parts.get("g_idx")
    if g_idx is None:
        g_idx = torch.arange(q.shape[0]) // _group_size(quant, q.shape[0])
    g_idx = g_idx.long()
    weight = (q - zeros[g_idx]).float() * parts["scales"].float()[g_idx]
    return weight.t().contiguous()


def _awq_values(parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [in, out], zero points [groups, out]), columns in order."""
    reorder = torch.tensor([AWQ_ORDER.index(j) for j in range(8)])  # column j: its nibble
    q, zeros = (unpack(parts[name], 4, 1) for name in ("qweight", "qzeros"))
    columns = (torch.arange(q.shape[1]) // 8) * 8 + reorder.repeat(q.shape[1] // 8)
    return q[:, columns], zeros[:, columns]


def dequantize_awq(parts: dict[str, torch.Tensor], quant: dict[str, Any]) -> torch.Tensor:
    q, zeros = _awq_values(parts)
    group = torch.arange(q.shape[0]) // _group_size(quant, q.shape[0])
    weight = (q - zeros[group]).float() * parts["scales"].float()[group]
    return weight.t().contiguous()


def _group_size(quant: dict[str, Any], in_features: int) -> int:
    size = quant.get("group_size", quant.get("q_group_size", -1))
    return in_features if size in (-1, None) else size


def check_packed(quant: dict[str, Any]) -> None:
    """Raises ValueError for a GPTQ or AWQ layout this module cannot unpack."""
    method = quant["quant_method"]
    bits = quant.get("bits", quant.get("w_bit", 4))
    if method == "gptq" and bits not in (2, 4, 8):
        raise ValueError(f"GPTQ with {bits}-bit weights: pagedgen unpacks 2, 4 and 8 bits")
    if method == "gptq" and quant.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {quant['checkpoint_format']!r} is not supported")
    if method == "awq" and (bits != 4 or str(quant.get("version", "gemm")).lower() != "gemm"):
        raise ValueError("AWQ: pagedgen unpacks 4-bit weights of the GEMM layout only")


PARTS = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales")}
DEQUANTIZE = {"gptq": dequantize_gptq, "awq": dequantize_awq}
QUANTIZED = {"gptq": quantized_gptq, "awq": quantized_awq}
