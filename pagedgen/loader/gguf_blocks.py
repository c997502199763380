"""GGUF's quantized blocks repacked, losslessly, into QuantizedWeight: llama.cpp's block layouts
(ggml-common.h), read as gguf.quants.dequantize reads them, the reference the tests hold every
type to, bit for bit.

    type   block  bits  group  q held   scale        min
    Q4_0   32     4     32     q        d            -8 * d
    Q4_1   32     4     32     q        d            m
    Q5_0   32     8     32     q - 16   d            -
    Q5_1   32     8     32     q        d            m
    Q8_0   32     8     32     q        d            -
    Q4_K   256    4     32     q        d * sc[j]    -(dmin * m[j])
    Q5_K   256    8     32     q        d * sc[j]    -(dmin * m[j])
    Q6_K   256    8     16     q - 32   d * sc[j]    -

d, m and dmin are float16; sc and m[j] 6-bit integers (Q6_K's sc int8). Every scale and every
q * scale is exact in float32 (at most 11 + 7 + 6 = 24 significant bits), so q * scale + min
rounds once where the reference's d * q + m (Q4_1, Q5_1) or d * q - dm (K-quants) rounds, on the
same values; Q4_0's q * d - 8 * d is its d * (q - 8) exactly, since that is representable.
"""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pagedgen.layers.quantized_weight import QuantizedWeight

Q = GGMLQuantizationType
NIBBLES = np.array([0, 4], dtype=np.uint8)
CRUMBS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)  # Q6_K's 2-bit fields


def repack(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]
) -> QuantizedWeight:
    """A [N, K] tensor's blocks (bytes, K // block_size blocks a row, rows in order) as the
    QuantizedWeight of the same values."""
    n, k = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype not in REPACK:
        raise ValueError(f"GGUF {qtype.name} blocks are not repacked; pagedgen takes {TYPES}")
    if k % block_size or data.size != n * k // block_size * type_size:
        raise ValueError(f"{data.size} bytes are not {qtype.name} blocks of a {n}x{k} tensor")
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(-1, type_size)
    bits, q, scales, mins = REPACK[qtype](blocks)
    return QuantizedWeight(
        bits,
        k // (scales.size // n),
        torch.from_numpy(np.ascontiguousarray(q).reshape(n, -1)),
        torch.from_numpy(scales.reshape(n, -1)),
        None if mins is None else torch.from_numpy(mins.reshape(n, -1)),
    )


# bits, q as QuantizedWeight stores it (4 bits: packed bytes), scales, mins; a row a block
Repacked = tuple[int, np.ndarray, np.ndarray, np.ndarray | None]


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte at of each block, as float32 [num_blocks, 1]."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _low_high(qs: np.ndarray, rows: int) -> np.ndarray:
    """Bytes [num_blocks, rows * width] -> nibbles [num_blocks, rows, 2 * width]: each row's
    low nibbles, then its high ones."""
    qs = qs.reshape(qs.shape[0], rows, 1, -1) >> NIBBLES.reshape(1, 1, 2, 1)
    return (qs & np.uint8(0x0F)).reshape(qs.shape[0], rows, -1)


def _packed(qs: np.ndarray, runs: int) -> np.ndarray:
    """4-bit values from GGUF's packing to QuantizedWeight's without unpacking them. GGUF: a run
    of B bytes holds 2B values, the first B in the low nibbles, the next B in the high ones.
    QuantizedWeight: byte m holds values 2m (low) and 2m + 1 (high). So bytes 2m and 2m + 1 of
    a run give its byte m from their low nibbles and its byte B/2 + m from their high ones."""
    qs = qs.reshape(qs.shape[0], runs, -1)
    even, odd = qs[..., 0::2], qs[..., 1::2]
    low = (even & np.uint8(0x0F)) | (odd << np.uint8(4))
    high = (even >> np.uint8(4)) | (odd & np.uint8(0xF0))
    return np.concatenate([low, high], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's 32 fifth bits, a little-endian uint32 a block -> [num_blocks, 32] 0 / 16."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)


def _q4_0(blocks: np.ndarray) -> Repacked:
    d = _half(blocks, 0)
    return 4, _packed(blocks[:, 2:], 1), d, -8 * d


def _q4_1(blocks: np.ndarray) -> Repacked:
    return 4, _packed(blocks[:, 4:], 1), _half(blocks, 0), _half(blocks, 2)


def _q5_0(blocks: np.ndarray) -> Repacked:
    q = _low_high(blocks[:, 6:], 1).reshape(-1, 32) | _fifth_bits(blocks[:, 2:6])
    return 8, q.astype(np.int8) - np.int8(16), _half(blocks, 0), None


def _q5_1(blocks: np.ndarray) -> Repacked:
    q = _low_high(blocks[:, 8:], 1).reshape(-1, 32) | _fifth_bits(blocks[:, 4:8])
    return 8, q.astype(np.int8), _half(blocks, 0), _half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> Repacked:
    return 8, blocks[:, 2:].copy().view(np.int8), _half(blocks, 0), None


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 8 sub-block scales and mins, 6 bits each in 12 bytes at byte 4:
    bytes 0-3 hold scales 0-3 (and the top bits of 4-7), 4-7 mins 0-3 (likewise), 8-11 the low
    nibbles of scales 4-7 and, above them, of mins 4-7."""
    packed = blocks[:, 4:16].reshape(-1, 3, 4)
    d, m, m_d = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(blocks: np.ndarray) -> Repacked:
    sc, mn = _k_scales(blocks)
    return 4, _packed(blocks[:, 16:], 4), _half(blocks, 0) * sc, -(_half(blocks, 2) * mn)


def _q5_k(blocks: np.ndarray) -> Repacked:
    sc, mn = _k_scales(blocks)
    qh = np.unpackbits(blocks[:, 16:48], axis=-1, bitorder="little")  # value i: bit j of byte i
    qh = qh.reshape(-1, 32, 8).transpose(0, 2, 1)  # [num_blocks, sub-block j, i]
    q = _low_high(blocks[:, 48:], 4).reshape(-1, 8, 32) | (qh << np.uint8(4))
    return 8, q.astype(np.int8), _half(blocks, 0) * sc, -(_half(blocks, 2) * mn)


def _q6_k(blocks: np.ndarray) -> Repacked:
    """ql (128 bytes): two halves of 128 values, low then high nibbles of 64 bytes each; qh (64
    bytes): the top 2 bits, two halves of 32 bytes, bits 0-1, 2-3, 4-5, 6-7 for successive runs
    of 32; then 16 int8 scales and d."""
    ql = _low_high(blocks[:, :128], 2).reshape(-1, 8, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> CRUMBS
    q = ql | ((qh.reshape(-1, 8, 32) & np.uint8(3)) << np.uint8(4))
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    return 8, q.astype(np.int8) - np.int8(32), _half(blocks, 208) * sc, None


REPACK = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
TYPES = ", ".join(t.name for t in REPACK)
DENSE = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
