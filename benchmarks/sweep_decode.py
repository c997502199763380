"""Sweeps the decode kernels' compile-time knobs (decode_tunings.SWEEP: threads a block, register
budget, the grouped kernel's loads in flight) over the attention shapes of bench_kernels.py, each
with and without L2 prefetch of the next KV block, and the tensor-core kernel's ("mma") v1/v2
plans: the planner's own, forced v1, and forced v2 at each of paged_attention_mma.PARTITION_SIZES,
then its stages and register budgets (SWEEP["mma"]), and on the uneven shape v1 taking the longest
sequences first (seq_order) with each. Each is timed as bench_kernels times them (one CUDA graph of
`iters` repetitions over K/V twice the L2 in all; bytes counted once). Prints every variant's GPU ms
and share of the peak bandwidth against its kernel's default (the default tuning without prefetch;
for mma the planner's choice), then the best variant per shape; --output-json keeps them all.

    python benchmarks/sweep_decode.py [--dtype bfloat16] [--iters 30] [--kinds per-head,grouped,mma]
        [--shapes 0,6]   (indices into attention_shapes.ATTENTION_SHAPES; all by default)
"""

import argparse
import json
from pathlib import Path

import torch
from attention_shapes import ATTENTION_SHAPES, Shape, is_uneven, shape_label
from bench_kernels import AttentionTiming, attention_batch, time_attention
from decode_tunings import SWEEP
from rich.console import Console
from rich.table import Table

from pagedgen.kernels import loader
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING
from pagedgen.kernels.paged_attention_mma import PARTITION_SIZES

# The mma kernel's variants, its default (the planner's own plan) first: (label, version,
# partition_size).
MMA_PLANS = [
    ("planner's choice", None, None),
    ("forced v1", 1, None),
    *((f"forced v2, partitions of {size}", 2, size) for size in PARTITION_SIZES),
]


def sweep_shape(shape: Shape, dtype: torch.dtype, kinds: list[str], iters: int) -> list:
    """Every (kernel, tuning, prefetch) and mma plan on one shape: dicts of its figures, each
    kernel's default first."""
    batch = attention_batch(shape, dtype)
    rows = []

    def add(kind: str, tuning: dict, label: str, timing: AttentionTiming) -> None:
        rows.append(
            {
                "kernel": kind,
                "tuning": tuning,
                "label": label,
                "plan": timing.plan,
                "gpu_ms": timing.gpu_ms,
                "gbps": batch.bytes_moved / timing.gpu_ms / 1e6,
            }
        )

    for kind in kinds:
        if kind == "mma":
            for label, version, size in MMA_PLANS:
                options = dict(tensor_cores=True, version=version, partition_size=size)
                timing = time_attention(batch, False, False, iters, **options)
                add(kind, {"version": version, "partition_size": size}, label, timing)
            for tuning in SWEEP["mma"]:  # stages and register budgets, the planner's plan
                timing = time_attention(batch, False, False, iters, tuning, tensor_cores=True)
                add(kind, tuning._asdict(), f"{tuning.label}, planner's choice", timing)
            for tuning in (DEFAULT_TUNING, *SWEEP["mma"]) if is_uneven(shape) else ():
                # v1 taking the longest sequences first, where their order matters
                options = dict(tensor_cores=True, version=1, longest_first=True)
                timing = time_attention(batch, False, False, iters, tuning, **options)
                add(kind, tuning._asdict(), f"{tuning.label}, v1 longest first", timing)
            continue
        for tuning in (DEFAULT_TUNING, *SWEEP[kind]):
            for l2_prefetch in (False, True):
                timing = time_attention(batch, kind == "grouped", l2_prefetch, iters, tuning)
                label = tuning.label + (" +prefetch" if l2_prefetch else "")
                add(kind, tuning._asdict(), label, timing)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--kinds", default="per-head,grouped,mma")
    parser.add_argument("--shapes", help="indices into ATTENTION_SHAPES, comma-separated")
    parser.add_argument("--output-json", type=Path)
    options = parser.parse_args()
    if not (torch.cuda.is_available() and loader.cupy_available()):
        raise SystemExit("this benchmark needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')")
    dtype, kinds = getattr(torch, options.dtype), options.kinds.split(",")
    peak = loader.peak_memory_bandwidth(torch.cuda.current_device()) / 1e9
    console = Console(width=200)
    console.print(f"{torch.cuda.get_device_name()}: peak {peak:.0f} GB/s, {options.dtype}")
    results, best = {}, Table("shape", "best kernel", "tuning", "plan", "GPU ms", "% of peak")
    indices = range(len(ATTENTION_SHAPES))
    if options.shapes:
        indices = [int(index) for index in options.shapes.split(",")]
    for shape in [ATTENTION_SHAPES[index] for index in indices]:
        label = shape_label(shape)
        rows = sweep_shape(shape, dtype, kinds, options.iters)
        results[label] = rows
        table = Table("kernel", "tuning", "plan", "GPU ms", "% of peak", "vs default", title=label)
        defaults = {}  # each kernel's first row: its default
        for row in rows:
            defaults.setdefault(row["kernel"], row["gpu_ms"])
        for row in sorted(rows, key=lambda r: r["gpu_ms"]):
            table.add_row(
                row["kernel"],
                row["label"],
                row["plan"],
                f"{row['gpu_ms']:.3f}",
                f"{100 * row['gbps'] / peak:.0f}%",
                f"{defaults[row['kernel']] / row['gpu_ms']:.2f}x",
            )
        console.print(table)
        top = min(rows, key=lambda r: r["gpu_ms"])
        best.add_row(
            label,
            top["kernel"],
            top["label"],
            top["plan"],
            f"{top['gpu_ms']:.3f}",
            f"{100 * top['gbps'] / peak:.0f}%",
        )
    console.print(best)
    if options.output_json:
        options.output_json.write_text(json.dumps({"peak_gbps": peak, "shapes": results}, indent=1))


if __name__ == "__main__":
    main()
