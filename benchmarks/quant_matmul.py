"""Decode-shaped matmuls over bfloat16 and quantized weights: ms per call and GB/s of weight bytes
streamed, for the bfloat16 panel kernel (cpu_gemm_bf16; on a CPU without it, as a bfloat16 model
computes there, the float32 panel kernel over bfloat16 weights with float32 x), the int8 / int4
kernels (cpu_gemm_quant) on the same activations, with two int8 digits of x and, for int8, with
one ("int8 W8A8", as online int8 computes without AMX), and, where it runs, the quantized kernel
with the bfloat16 path's bits (cpu_gemm_quant_bf16, "on bf16"). Default shape: Llama-3.2-1B's MLP
(K 2048, N 8192).

    python benchmarks/quant_matmul.py --threads 2 --rows 1 64

--march runs the quantized kernels in the named builds side by side instead of the machine's own
(AMX-INT8 included): x86-64-v3 (AVX2), x86-64-v3+avxvnni (AVX2 with AVX-VNNI), x86-64 (plain C).
"""

import argparse
import time
from collections.abc import Callable

import torch

from pagedgen.kernels import cpu_gemm, cpu_gemm_bf16, cpu_gemm_quant, cpu_gemm_quant_bf16
from pagedgen.kernels.cpu_features import isa_name
from pagedgen.layers.quantized_weight import quantize_int4, quantize_int8


def best_ms(fns: list[Callable[[], object]], min_time: float, repeats: int) -> list[float]:
    """Each fn's best ms a call over repeats rounds that take turns (on a shared machine, a busy
    spell then costs every kernel alike)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < min_time:
                fn()
                calls += 1
            best[i] = min(best[i], (time.perf_counter() - start) / calls * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("-k", type=int, default=2048)
    parser.add_argument("-n", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--march", nargs="+", help="builds of the quantized kernel to compare")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, k = args.n, args.k
    weight = torch.randn(n, k).bfloat16()
    kernels: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {}
    x_dtype = torch.bfloat16
    if cpu_gemm_bf16.enabled():
        packed = cpu_gemm_bf16.pack(weight)
        kernels["bf16"] = (packed.numel() * 2, lambda x: cpu_gemm_bf16.linear(x, packed, None, n))
    elif cpu_gemm.enabled():
        x_dtype, panels = torch.float32, cpu_gemm.pack(weight)
        kernels["bf16"] = (panels.numel() * 2, lambda x: cpu_gemm.linear(x, panels, None, n))
    for name, quantized in (("int8", quantize_int8(weight)), ("int4", quantize_int4(weight))):
        q = quantized
        qpacked = cpu_gemm_quant.pack(q.qweight, q.scales, q.mins, q.bits, q.group_size)
        has_mins = q.mins is not None
        for march in args.march or [None]:
            for digits in (2, 1) if q.bits == 8 else (2,):

                def run(x, q=q, qpacked=qpacked, has_mins=has_mins, march=march, digits=digits):
                    args = (n, q.bits, q.group_size, has_mins)
                    return cpu_gemm_quant.linear(
                        x, qpacked, None, *args, march=march, digits=digits
                    )

                label = name + (" W8A8" if digits == 1 else "")
                if march is not None:
                    label += f" {cpu_gemm_quant.path_name(march)}"
                kernels[label] = (qpacked.numel(), run)
        if x_dtype == torch.bfloat16 and cpu_gemm_quant_bf16.error() is None:
            bpacked = cpu_gemm_quant_bf16.pack(q.qweight, q.scales, q.mins, q.bits, q.group_size)

            def run_bf16(x: torch.Tensor, q=q, bpacked=bpacked, has_mins=has_mins):
                args = (n, q.bits, q.group_size, has_mins)
                return cpu_gemm_quant_bf16.linear(x, bpacked, None, *args)

            kernels[f"{name} on bf16"] = (bpacked.numel(), run_bf16)
    paths = ", ".join(cpu_gemm_quant.path_name(march) for march in args.march or [None])
    print(
        f"{isa_name()}, {args.threads} threads, quantized path {paths}; "
        f"y[M, {n}] = x[M, {k}] @ W.T, {str(x_dtype).removeprefix('torch.')} x"
    )
    for rows in args.rows:
        x = torch.randn(rows, k).to(x_dtype)
        runs = [lambda fn=fn, x=x: fn(x) for _, fn in kernels.values()]
        times = best_ms(runs, args.min_time, args.repeats)
        for (name, (nbytes, _)), ms in zip(kernels.items(), times):
            print(
                f"M {rows:4d} {name:21s} {nbytes / 2**20:7.1f} MiB  {ms:8.3f} ms  "
                f"{nbytes / ms / 1e6:7.1f} GB/s"
            )


if __name__ == "__main__":
    main()
