"""A Linear's weight computed on at its quantized size on the CPU (kernels/cpu_gemm_quant.c).

A fused projection's shards may come in different formats (a GGUF Q4_K_M file stores v_proj in
Q6_K, q_proj and k_proj in Q4_K): consecutive shards of one format are packed together, and each
run of them is its own segment of output columns, computed by its own kernel call into its column
range of one output. Requantizing the shards to a common format instead would be lossless only
upward (Q4_K into int8 in groups of 16), doubling their bytes, which is what the layer exists to
save; a segment costs one more call per step, and shards of one format (the common case) are one
segment.

In a bfloat16 model, segments in groups of a multiple of 32 run on cpu_gemm_quant_bf16 instead,
wherever the dense bfloat16 path is our own kernel: that path's bits over the dequantized weight
(the integers dequantized into bfloat16 tiles on AMX, 1.0-1.7x the dense path's speed from 1 to 64
rows; into the dense kernel's panels on AVX512_BF16, 1.6-2.5x the integer scheme's speed at 16-400
rows of Llama-3-8B's shapes on a Zen 4); others (Q6_K's groups of 16) keep cpu_gemm_quant's
integer scheme."""

from typing import NamedTuple

import torch
from torch import nn

from pagedgen.kernels import cpu_gemm_quant, cpu_gemm_quant_bf16
from pagedgen.layers.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8

# EngineConfig.quantization: online quantization of a float checkpoint's linear layers
ONLINE_QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4}


def quantize_online(weight: torch.Tensor, quantization: str) -> QuantizedWeight | None:
    """weight [N, K] quantized as quantization ("int8", "int4") says, or None where the kernel's
    groups cannot hold K (not a multiple of 16): that layer stays in float."""
    if weight.shape[1] % 16:
        return None
    return ONLINE_QUANTIZERS[quantization](weight)


class Segment(NamedTuple):
    """Output columns [start, start + size) in one format."""

    start: int
    size: int
    bits: int
    group_size: int
    has_mins: bool
    half: bool  # scales and mins packed in float16 (cpu_gemm_quant.float16_params)
    bf16_tiles: bool  # packed for cpu_gemm_quant_bf16 (bfloat16 activations)
    digits: int  # cpu_gemm_quant's int8 digits of x: 1 (W8A8) or 2

    def format(self, in_features: int) -> str:
        """e.g. "int4 g32 +mins", "int8 per row x int8", "int4 g128 +mins on bfloat16 tiles"."""
        groups = "per row" if self.group_size == in_features else f"g{self.group_size}"
        mins = " +mins" if self.has_mins else ""
        activations = " x int8" if self.digits == 1 else ""
        return f"int{self.bits} {groups}{mins}{activations}" + (
            bf16_suffix() if self.bf16_tiles else ""
        )


def bf16_suffix() -> str:
    """A segment's format's ending where cpu_gemm_quant_bf16 computes it: " on bfloat16 tiles"
    (AMX) or " on bfloat16 dot products" (AVX512_BF16)."""
    return f" on {cpu_gemm_quant_bf16.path_name()}"


def format_of(w: QuantizedWeight) -> tuple[int, int, bool, bool]:
    return w.bits, w.group_size, w.mins is None, w.int8_activations


def same_format(a: QuantizedWeight, b: QuantizedWeight) -> bool:
    return format_of(a) == format_of(b)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Shards of one format as one weight, their rows in order."""
    if len(parts) == 1:
        return parts[0]
    mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
    return QuantizedWeight(
        parts[0].bits,
        parts[0].group_size,
        torch.cat([p.qweight for p in parts]),
        torch.cat([p.scales for p in parts]),
        mins,
        parts[0].int8_activations,
    )


def kernel_takes(shards: list[QuantizedWeight], dtype: torch.dtype) -> bool:
    """Whether cpu_gemm_quant computes these shards for activations of dtype here."""
    return (
        dtype in cpu_gemm_quant.ACTIVATION_DTYPES
        and cpu_gemm_quant.enabled()
        and all(s.group_size % 16 == 0 for s in shards)
    )


def bf16_tiles_take(shards: list[QuantizedWeight]) -> bool:
    """Whether cpu_gemm_quant_bf16 computes every one of these shards here on AMX tiles (for
    bfloat16 activations: the dense bfloat16 path's bits, and faster than it up to 64 rows). On
    AVX512_BF16 dot products it takes them too, but behind the dense path at decode batches (0.87x
    at 54 rows of SmolLM2's gate/up on a Zen 4: each panel's dequantizing comes on top), so a
    checkpoint's own integers stay there only where asked for."""
    return cpu_gemm_quant_bf16.on_tiles() and all(
        cpu_gemm_quant_bf16.takes(s.bits, s.group_size, s.shape[1]) for s in shards
    )


class QuantizedPanels(nn.Module):
    """A layer's quantized weight packed into cpu_gemm_quant's panels, one packed tensor per
    segment (uint8 parameters: counted among the model's weights at their size, left alone by
    .to(dtype))."""

    def __init__(self, shards: list[QuantizedWeight], dtype: torch.dtype) -> None:
        super().__init__()
        runs: list[list[QuantizedWeight]] = []
        for shard in shards:
            if runs and same_format(runs[-1][-1], shard):
                runs[-1].append(shard)
            else:
                runs.append([shard])
        self.in_features = shards[0].shape[1]
        self.segments: list[Segment] = []
        self.packed = nn.ParameterList()
        start = 0
        for run in runs:
            weight = concat_rows(run)
            size, mins, group_size = weight.shape[0], weight.mins, weight.group_size
            one_digit = weight.int8_activations and cpu_gemm_quant.int8_activations_faster()
            tiles = (
                not one_digit
                and dtype == torch.bfloat16
                and cpu_gemm_quant_bf16.takes(weight.bits, group_size, self.in_features)
            )
            half = not tiles and cpu_gemm_quant.float16_params(weight.scales, mins)
            digits = 1 if one_digit else 2
            self.segments.append(
                Segment(start, size, weight.bits, group_size, mins is not None, half, tiles, digits)
            )
            if tiles:
                packed = cpu_gemm_quant_bf16.pack(
                    weight.qweight, weight.scales, mins, weight.bits, group_size
                )
            else:
                packed = cpu_gemm_quant.pack(
                    weight.qweight, weight.scales, mins, weight.bits, group_size, half
                )
            self.packed.append(nn.Parameter(packed, requires_grad=False))
            start += size
        self.out_features = start

    @property
    def formats(self) -> list[str]:
        return [s.format(self.in_features) for s in self.segments]

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if len(self.segments) == 1:
            return self._segment(self.segments[0], self.packed[0], x, bias)
        rows = x.reshape(-1, x.shape[-1])
        y = torch.empty(rows.shape[0], self.out_features, dtype=x.dtype)
        for s, packed in zip(self.segments, self.packed):
            columns = slice(s.start, s.start + s.size)
            b = None if bias is None else bias[columns]
            self._segment(s, packed, rows, b, out=y[:, columns])
        return y.view(*x.shape[:-1], self.out_features)

    @staticmethod
    def _segment(
        s: Segment,
        packed: torch.Tensor,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if s.bf16_tiles:
            return cpu_gemm_quant_bf16.linear(
                x, packed, bias, s.size, s.bits, s.group_size, s.has_mins, out=out
            )
        return cpu_gemm_quant.linear(
            x,
            packed,
            bias,
            s.size,
            s.bits,
            s.group_size,
            s.has_mins,
            s.half,
            out=out,
            digits=s.digits,
        )


def dequantize_into(weight: torch.Tensor, shards: list[QuantizedWeight]) -> None:
    """The shards' float values into the dense weight's rows, in order (where no kernel takes
    them: a GPU, a half-precision activation dtype, the kernel disabled)."""
    start = 0
    for shard in shards:
        size = shard.shape[0]
        weight[start : start + size].copy_(shard.dequantize())
        start += size
