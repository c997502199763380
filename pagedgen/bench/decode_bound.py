"""How far the profiled decode steps are from the bytes they must move: a decode step reads every
weight once and every context token's K/V once, so (weight bytes + K/V bytes) / HBM bandwidth
bounds its time from below (vLLM's and the roofline model's memory-bound decode)."""

import torch

from pagedgen.bench.gpu_profile import GpuProfile
from pagedgen.bench.roofline import model_costs
from pagedgen.llm import LLM


def hbm_peak_bytes_per_s(device: torch.device) -> float | None:
    """The device's peak memory bandwidth (kernels.loader, through CuPy); None without CuPy or
    a GPU."""
    from pagedgen.kernels import loader

    if device.type != "cuda" or not loader.cupy_available():
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return loader.peak_memory_bandwidth(index)


def decode_bound(
    profile: GpuProfile, weight_bytes: float, kv_bytes_per_token: int, peak_bytes_per_s: float
) -> dict | None:
    """The steps' mean time against their bytes bound; None without a decode step."""
    steps = profile.num_steps
    if not steps:
        return None
    kv_bytes = profile.kv_tokens * kv_bytes_per_token / steps
    bound_s = (weight_bytes + kv_bytes) / peak_bytes_per_s
    step_s = profile.window_s / steps
    plain_s = profile.plain_step_s
    return {
        "step_ms": 1000 * step_s,
        "bound_ms": 1000 * bound_s,
        "weight_gb": weight_bytes / 1e9,
        "kv_gb_per_step": kv_bytes / 1e9,
        "peak_gbps": peak_bytes_per_s / 1e9,
        "ratio": step_s / bound_s,
        "plain_step_ms": None if plain_s is None else 1000 * plain_s,
        "plain_ratio": None if plain_s is None else plain_s / bound_s,
    }


def llm_decode_bound(llm: LLM, profile: GpuProfile) -> dict | None:
    """decode_bound of the engine's model on its device (None where the peak is unknown)."""
    runner = llm.engine.runner
    peak = hbm_peak_bytes_per_s(runner.device)
    if peak is None:
        return None
    _, weight_bytes = model_costs(runner.model)  # every weight but the token embedding's
    return decode_bound(profile, weight_bytes, runner.geometry.bytes_per_token, peak)


def decode_bound_line(bound: dict) -> str:
    line = (
        f"decode steps {bound['step_ms']:.2f} ms (under torch.profiler) against "
        f"{bound['bound_ms']:.2f} ms to move their bytes ({bound['weight_gb']:.2f} GB of weights "
        f"+ {bound['kv_gb_per_step']:.2f} GB of K/V a step at {bound['peak_gbps']:,.0f} GB/s): "
        f"{bound['ratio']:.2f}x"
    )
    if bound.get("plain_step_ms") is not None:
        line += f"; unprofiled {bound['plain_step_ms']:.2f} ms: {bound['plain_ratio']:.2f}x"
    return line
