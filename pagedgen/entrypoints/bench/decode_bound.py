"""How far the profiled decode steps are from the bytes they must move and the arithmetic they
must do. A decode step reads every weight once and every context token's K/V once, so (weight
bytes + K/V bytes) / HBM bandwidth bounds its time from below (vLLM's and the roofline model's
memory-bound decode). At large batches the matmuls are compute-bound instead: they take at least
max(weight bytes / HBM bandwidth, their FLOPs / the matmul peak), and attention's K/V reads come
after them, so the step's floor is that plus K/V bytes / HBM bandwidth."""

import torch

from pagedgen.entrypoints.bench.gpu_profile import GpuProfile
from pagedgen.entrypoints.bench.roofline import measure_matmul, model_costs
from pagedgen.entrypoints.llm import LLM

# The square bfloat16/float16 product large enough to reach a GPU's matmul peak.
PEAK_MATMUL_SIZE = 8192


def hbm_peak_bytes_per_s(device: torch.device) -> float | None:
    """The device's peak memory bandwidth (kernels.loader, through CuPy); None without CuPy or
    a GPU."""
    from pagedgen.kernels import loader

    if device.type != "cuda" or not loader.cupy_available():
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return loader.peak_memory_bandwidth(index)


def decode_bound(
    profile: GpuProfile,
    weight_bytes: float,
    kv_bytes_per_token: int,
    peak_bytes_per_s: float,
    flops_per_token: float | None = None,
    peak_flops: float | None = None,
) -> dict | None:
    """The steps' mean time against their bytes bound, and with flops_per_token and peak_flops
    (the matmul peak) against their floor; None without a decode step."""
    steps = profile.num_steps
    if not steps:
        return None
    kv_bytes = profile.kv_tokens * kv_bytes_per_token / steps
    bound_s = (weight_bytes + kv_bytes) / peak_bytes_per_s
    step_s = profile.window_s / steps
    plain_s = profile.plain_step_s
    bound = {
        "step_ms": 1000 * step_s,
        "bound_ms": 1000 * bound_s,
        "weight_gb": weight_bytes / 1e9,
        "kv_gb_per_step": kv_bytes / 1e9,
        "peak_gbps": peak_bytes_per_s / 1e9,
        "ratio": step_s / bound_s,
        "plain_step_ms": None if plain_s is None else 1000 * plain_s,
        "plain_ratio": None if plain_s is None else plain_s / bound_s,
    }
    if flops_per_token is None or peak_flops is None:
        return bound
    matmul_flops = flops_per_token * profile.num_tokens / steps
    matmul_s = max(weight_bytes / peak_bytes_per_s, matmul_flops / peak_flops)
    floor_s = matmul_s + kv_bytes / peak_bytes_per_s
    return bound | {
        "matmul_tflop_per_step": matmul_flops / 1e12,
        "peak_tflops": peak_flops / 1e12,
        "floor_ms": 1000 * floor_s,
        "floor_ratio": step_s / floor_s,
        "plain_floor_ratio": None if plain_s is None else plain_s / floor_s,
    }


def llm_decode_bound(llm: LLM, profile: GpuProfile) -> dict | None:
    """decode_bound of the engine's model on its device, against the matmul peak measured there
    in the model's dtype (None where the bandwidth peak is unknown)."""
    runner = llm.engine.runner
    peak = hbm_peak_bytes_per_s(runner.device)
    if peak is None:
        return None
    flops_per_token, weight_bytes = model_costs(runner.model)  # all but the token embedding
    dtype = next(runner.model.parameters()).dtype
    n = PEAK_MATMUL_SIZE
    peak_flops = 1e9 * measure_matmul(n, n, n, dtype, runner.device, min_time=0.05)
    return decode_bound(
        profile, weight_bytes, runner.geometry.bytes_per_token, peak, flops_per_token, peak_flops
    )


def decode_bound_line(bound: dict) -> str:
    line = (
        f"decode steps {bound['step_ms']:.2f} ms (under torch.profiler) against "
        f"{bound['bound_ms']:.2f} ms to move their bytes ({bound['weight_gb']:.2f} GB of weights "
        f"+ {bound['kv_gb_per_step']:.2f} GB of K/V a step at {bound['peak_gbps']:,.0f} GB/s): "
        f"{bound['ratio']:.2f}x"
    )
    if bound.get("plain_step_ms") is not None:
        line += f"; unprofiled {bound['plain_step_ms']:.2f} ms: {bound['plain_ratio']:.2f}x"
    if bound.get("floor_ms") is not None:
        line += (
            f"\nagainst their floor, {bound['floor_ms']:.2f} ms (matmuls "
            f"{bound['matmul_tflop_per_step']:.2f} TFLOP a step at the measured "
            f"{bound['peak_tflops']:,.0f} TFLOP/s or their weights' bytes, whichever is longer, "
            f"then the K/V bytes): {bound['floor_ratio']:.2f}x"
        )
        if bound["plain_floor_ratio"] is not None:
            line += f"; unprofiled {bound['plain_floor_ratio']:.2f}x"
    return line
