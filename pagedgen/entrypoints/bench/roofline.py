import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from pagedgen.kernels.cpu_features import cpu_compute_dtype
from pagedgen.layers.linear import Linear

COPY_BYTES = 256 << 20  # well past the last-level cache


@dataclass(slots=True)
class Roofline:
    """What this machine and model allow: measured fp matmul and copy speeds, and the model's
    cost per token (2 x non-embedding parameters FLOPs, attention left out) and per decode step
    (every non-embedding weight read once; the embedding is a gather of a few rows).

    Matmuls are timed through pagedgen's Linear (oneDNN where it packs) and through torch.mm
    (what transformers runs); the peak is the faster of the two."""

    matmul_gflops: dict[str, float]  # "MxKxN" -> GFLOP/s through pagedgen's Linear
    mm_gflops: dict[str, float]  # "MxKxN" -> GFLOP/s through torch.mm
    peak_gflops: float
    copy_gbps: float  # bytes read + written per second
    flops_per_token: float
    weight_bytes_per_step: float

    @property
    def max_tokens_per_s(self) -> float:
        return self.peak_gflops * 1e9 / self.flops_per_token

    @property
    def max_steps_per_s(self) -> float:
        return self.copy_gbps * 1e9 / self.weight_bytes_per_step

    def compute_share(self, num_tokens: int, elapsed: float) -> float:
        """Useful FLOP/s of a run (prompt + output tokens, no padding) over the matmul peak."""
        return num_tokens / elapsed / self.max_tokens_per_s

    def bandwidth_share(self, num_steps: int, elapsed: float) -> float:
        """Weight bytes streamed per second by a run's decode steps over the copy speed."""
        return num_steps / elapsed / self.max_steps_per_s

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "max_tokens_per_s": self.max_tokens_per_s,
            "max_decode_steps_per_s": self.max_steps_per_s,
        }


def model_costs(model: nn.Module) -> tuple[float, float]:
    """(FLOPs per token, weight bytes per decode step) of a decoder whose token embedding is an
    nn.Embedding and whose lm_head is a separate matrix (pagedgen's models, tied or not). A
    quantized layer's weights count at their packed size and its FLOPs as its float shape's."""
    params = {id(p): p for p in model.parameters()}.values()
    embeddings = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.weight.numel()
    }
    dense = [p for p in params if id(p) not in embeddings]
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    # (a Linear counts by its shape: packed panels may hold bfloat16 as integers, quantized
    # ones nothing)
    packed = {id(m.weight) for m in linears}
    num_dense = sum(m.in_features * m.out_features for m in linears)
    num_dense += sum(p.numel() for p in dense if p.is_floating_point() and id(p) not in packed)
    return 2.0 * num_dense, float(sum(p.numel() * p.element_size() for p in dense))


def matmul_shapes(hidden: int, intermediate: int, vocab: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of the model's biggest matmuls at a decode batch of 64 and a 512-token prefill."""
    return [
        (64, hidden, 2 * intermediate),
        (512, hidden, 2 * intermediate),
        (512, intermediate, hidden),
        (64, hidden, vocab),
    ]


def measure_matmul(
    m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, min_time: float = 0.3
) -> float:
    """Best GFLOP/s of `a @ b` for [m, k] x [k, n] over 3 repeats of at least min_time each."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    seconds = _best_time(lambda: torch.mm(a, b, out=out), device, min_time)
    return 2 * m * k * n / seconds / 1e9


def measure_linear(
    m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, min_time: float = 0.3
) -> float:
    """The same through pagedgen's Linear, packed as the engine packs its weights, over
    activations of the engine's compute dtype (a CPU without bfloat16 arithmetic computes a
    bfloat16 model in float32)."""
    compute_dtype = cpu_compute_dtype(dtype) if device.type == "cpu" else dtype
    layer = Linear(k, n).to(device=device, dtype=dtype)
    layer.weight.data.normal_()
    layer.pack(compute_dtype)
    a = torch.randn(m, k, dtype=compute_dtype, device=device)
    with torch.inference_mode():
        seconds = _best_time(lambda: layer(a), device, min_time)
    return 2 * m * k * n / seconds / 1e9


def measure_copy(device: torch.device, num_bytes: int = COPY_BYTES, min_time: float = 0.3) -> float:
    """Best GB/s of a large tensor copy, counting the bytes read and written."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / _best_time(lambda: dst.copy_(src), device, min_time) / 1e9


def measure_roofline(
    model: nn.Module, hidden: int, intermediate: int, vocab: int, dtype: torch.dtype
) -> Roofline:
    device = next(model.parameters()).device
    shapes = matmul_shapes(hidden, intermediate, vocab)
    linear = {
        f"{m}x{k}x{n}": round(measure_linear(m, k, n, dtype, device), 1) for m, k, n in shapes
    }
    mm = {f"{m}x{k}x{n}": round(measure_matmul(m, k, n, dtype, device), 1) for m, k, n in shapes}
    flops, weight_bytes = model_costs(model)
    peak = max(*linear.values(), *mm.values())
    return Roofline(linear, mm, peak, measure_copy(device), flops, weight_bytes)


def _best_time(fn, device: torch.device, min_time: float, repeats: int = 3) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    fn()
    best = float("inf")
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            fn()
            sync()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / count)
    return best
