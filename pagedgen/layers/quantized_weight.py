"""A linear layer's weight kept at its stored size: integers in groups along the input, with a
float scale and (optionally) a float minimum per group.

    weight[n, k] = q[n, k] * scales[n, k // group_size] + mins[n, k // group_size]

(mins absent: 0). Every format pagedgen computes natively is one of these, losslessly:
GGUF's Q4_0 (4 bits, groups of 32, min = -8 * scale), Q4_1, Q5_0 / Q5_1 (int8 holding 5 bits),
Q8_0, Q4_K / Q5_K (a sub-block's scale and min as the group's: groups of 32), Q6_K (int8 holding
q - 32, groups of 16); GPTQ / AWQ (min = -zero * scale); online int8 (one group per row) and
int4 (groups of 128)."""

from dataclasses import dataclass

import torch

from pagedgen.kernels import cpu_gemm_quant

BITS = (4, 8)


@dataclass(frozen=True)
class QuantizedWeight:
    """bits 8: qweight int8 [N, K], values -128..127. bits 4: qweight uint8 [N, K // 2], value
    k in the low nibble of byte k // 2 when k is even, in the high nibble when odd; values
    0..15. scales and mins float32 [N, K // group_size]; group_size divides K. int8_activations:
    computed against activations quantized to int8 (W8A8, as vLLM's and SGLang's int8 layers
    compute), where that is the faster path (cpu_gemm_quant.int8_activations_faster); else to
    about 15 bits (two int8 digits)."""

    bits: int
    group_size: int
    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None
    int8_activations: bool = False

    def __post_init__(self) -> None:
        n, k = self.shape
        if self.bits not in BITS:
            raise ValueError(f"{self.bits}-bit weights: pagedgen computes on {BITS} bits")
        dtype = torch.int8 if self.bits == 8 else torch.uint8
        if self.qweight.dtype != dtype or self.qweight.dim() != 2:
            raise ValueError(f"{self.bits}-bit weights are a 2-D {dtype} tensor")
        if self.group_size <= 0 or k % self.group_size:
            raise ValueError(f"a group of {self.group_size} does not divide {k} inputs")
        groups = (n, k // self.group_size)
        for name, part in (("scales", self.scales), ("mins", self.mins)):
            if part is not None and (part.dtype != torch.float32 or tuple(part.shape) != groups):
                raise ValueError(f"{name} must be float32 {groups}, not {part.dtype} {part.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        n, width = self.qweight.shape
        return n, width * 2 if self.bits == 4 else width

    @property
    def nbytes(self) -> int:
        parts = (self.qweight, self.scales, self.mins)
        return sum(p.numel() * p.element_size() for p in parts if p is not None)

    def values(self) -> torch.Tensor:
        """q as int16 [N, K]."""
        if self.bits == 8:
            return self.qweight.to(torch.int16)
        q = self.qweight.to(torch.int16)
        return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(self.shape)

    def dequantize(self) -> torch.Tensor:
        """The dense float32 weight [N, K] (the reference the kernels are tested against)."""
        g = self.group_size
        scales = self.scales.repeat_interleave(g, dim=1)
        weight = self.values().float() * scales
        if self.mins is not None:
            weight = weight + self.mins.repeat_interleave(g, dim=1)
        return weight

    def rows(self, start: int, stop: int) -> "QuantizedWeight":
        """Output rows [start, stop)."""
        mins = None if self.mins is None else self.mins[start:stop]
        return QuantizedWeight(
            self.bits,
            self.group_size,
            self.qweight[start:stop],
            self.scales[start:stop],
            mins,
            self.int8_activations,
        )


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[N, K] integers 0..15 -> uint8 [N, K // 2], as QuantizedWeight holds them."""
    v = values.to(torch.uint8).reshape(values.shape[0], -1, 2)
    return v[..., 0] | (v[..., 1] << 4)


# Online quantization of a float checkpoint (EngineConfig.quantization), by cpu_gemm_quant's
# one-pass quantizer (tests/layers/test_quantized_linear.py holds its torch twin): int8 one group a
# row, symmetric; int4 in groups of 128 with a minimum each, the 16 levels spanning the group's own
# range; scales and minimums float16 values. On SmolLM2-135M's text NLL (float 3.489 over 8.6k
# tokens) this int4 gave 4.004, symmetric int4 (Q4_0's levels) 4.070, and a least-squares fit of
# scale and minimum (llama.cpp's make_qkx2_quants, unweighted) 4.025: lower weight error, worse
# predictions.
INT4_GROUP_SIZE = 128


def int4_group_size(in_features: int) -> int:
    """128, or the largest of 64, 32, 16 that divides in_features (a small model's width)."""
    for size in (INT4_GROUP_SIZE, 64, 32, 16):
        if in_features % size == 0:
            return size
    raise ValueError(f"int4 needs an input width that 16 divides, not {in_features}")


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """weight [N, K] -> int8, one scale per row: q = round(w / s), s = max|w| / 127; computed
    W8A8 (int8_activations)."""
    k = weight.shape[1]
    return QuantizedWeight(8, k, *cpu_gemm_quant.quantize(weight, 8, k), int8_activations=True)


def quantize_int4(weight: torch.Tensor, group_size: int | None = None) -> QuantizedWeight:
    """weight [N, K] -> 4 bits in groups (default int4_group_size(K)) with a minimum each:
    q = round((w - min) / s), s = (max - min) / 15."""
    group_size = group_size or int4_group_size(weight.shape[1])
    return QuantizedWeight(4, group_size, *cpu_gemm_quant.quantize(weight, 4, group_size))
