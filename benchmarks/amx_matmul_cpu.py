"""The AMX bfloat16 matmul (kernels/cpu_gemm_amx.c) alone, or with --kernel dot the AVX512_BF16
dot-product one (kernels/cpu_gemm_bf16.c: a CPU without AMX), its weights cold (copies rotated
through more memory than the L3 holds, as a model's step reads its layers), at decode batch
sizes on Llama-3.2-1B's layer shapes by default (--shapes K x N, ...; --rotated-mib 100 keeps
SmolLM2's layers in the L3 as its steps find them); with --baseline, the same kernel of another
source tree runs in turn with this one's, in the same process, its outputs checked equal:

    python benchmarks/amx_matmul_cpu.py [--rows 16,33,61,64] [--threads 2] [--baseline OTHER_TREE]
        [--shapes 576x3072,1536x576,576x960,576x576 --rotated-mib 100] [--kernel dot]
"""

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from pagedgen.kernels import cpu_build, cpu_gemm_bf16, source
from pagedgen.kernels.cpu_features import kernel_march

SHAPES = "2048x16384,8192x2048,2048x3072,2048x2048"  # K x N: gate/up, down, qkv, o


def library_of(kernels: Path | None, kernel: str) -> SimpleNamespace:
    """The kernel's entry point (linear) built from kernels/ of a source tree (None: this one)."""
    if kernels is not None:
        source.kernel_dir = lambda: kernels  # noqa: E731 (the loader asks this module)
    source.kernel_source.cache_clear()
    cpu_build.load_cpu_library.cache_clear()
    if kernel == "dot":
        cpu_gemm_bf16._library.cache_clear()
        return SimpleNamespace(linear=cpu_gemm_bf16._library(kernel_march()).linear_bf16)
    cpu_gemm_bf16._amx_library.cache_clear()
    return SimpleNamespace(linear=cpu_gemm_bf16._amx_library().linear_bf16_amx)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,33,61,64,128")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="a source tree whose kernel runs too")
    parser.add_argument("--shapes", default=SHAPES, help="K x N of each weight, comma-separated")
    parser.add_argument(
        "--rotated-mib", type=int, default=700, help="MiB of copies of a weight read in turn"
    )
    parser.add_argument("--kernel", choices=("amx", "dot"), default="amx")
    args = parser.parse_args()
    libraries = {"this": library_of(None, args.kernel)}
    if args.baseline is not None:
        libraries["baseline"] = library_of(args.baseline / "kernels", args.kernel)
    for shape in args.shapes.split(","):
        k, n = (int(d) for d in shape.split("x"))
        copies = max(2, (args.rotated_mib << 20) // (n * k * 2))
        weights = [cpu_gemm_bf16.pack(torch.randn(n, k).bfloat16()) for _ in range(copies)]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k).bfloat16()
            outs = {name: torch.empty(m, n, dtype=torch.bfloat16) for name in libraries}
            calls = {
                name: [
                    (y.data_ptr(), x.data_ptr(), k, w.data_ptr(), None, m, n, k, args.threads)
                    for w in weights
                ]
                for name, y in outs.items()
            }
            for name, library in libraries.items():
                assert library.linear(*calls[name][0]) == 0
            if len(outs) == 2:
                assert torch.equal(outs["this"], outs["baseline"]), "outputs differ"
            best = dict.fromkeys(libraries, float("inf"))
            for _ in range(args.repeats):
                for name, library in libraries.items():
                    start = time.perf_counter()
                    for call in calls[name]:
                        library.linear(*call)
                    best[name] = min(best[name], (time.perf_counter() - start) / len(weights))
            gb = n * k * 2 / 1e9
            line = f"K {k:5d} N {n:5d} rows {m:4d}: {best['this'] * 1e3:7.3f} ms"
            line += f" ({gb / best['this']:.1f} GB/s of W)"
            if "baseline" in best:
                ratio = best["baseline"] / best["this"]
                line += f", baseline {best['baseline'] * 1e3:7.3f} ms: {ratio:.3f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
