import json
import sys

import typer

from pagedgen.loader.resolve import DEFAULT_MODEL


def bench(
    workload: str = typer.Option(
        "sharegpt", help="sharegpt, fixed, latency (batch 1) or a workload FILE.json"
    ),
    save_workload: str | None = typer.Option(
        None, "--save-workload", help="write the workload run to this FILE.json, to run elsewhere"
    ),
    num_prompts: int = typer.Option(64, help="requests (sharegpt, fixed)"),
    input_len: int = typer.Option(128, help="prompt tokens (fixed, latency)"),
    output_len: int | None = typer.Option(
        None, help="output tokens (fixed: default 128, latency: default 64)"
    ),
    baselines: str = typer.Option(
        "static32,static64",
        help="comma-separated: static32, static64, generate_batch; '' for none",
    ),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="HF folder, hub id or .gguf"),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16 (both engines)"),
    device: str = typer.Option("cpu", help="cpu or cuda (both engines)"),
    threads: int = typer.Option(2, help="torch intra-op threads"),
    num_iters: int = typer.Option(1, help="timed passes per engine, round robin; best is kept"),
    kv_cache_memory: float | None = typer.Option(None, help="pagedgen's KV pool in GiB"),
    max_num_seqs: int = typer.Option(256, help="pagedgen's most sequences running at once"),
    max_num_batched_tokens: int | None = typer.Option(
        None, help="pagedgen's most tokens per step [default: the engine's]"
    ),
    block_size: int = typer.Option(16, help="pagedgen's tokens per KV-cache block"),
    kv_cache_dtype: str = typer.Option(
        "auto", help="pagedgen's KV-cache element type: auto (the model's), fp8 or fp8_e5m2"
    ),
    enforce_eager: bool = typer.Option(
        False, help="--enforce-eager runs pagedgen's decode steps without CUDA or CPU graphs"
    ),
    async_scheduling: bool = typer.Option(
        False, help="pagedgen schedules the next step while the device runs this one"
    ),
    roofline: bool = typer.Option(True, help="measure matmul and copy speeds"),
    overhead: bool = typer.Option(
        True,
        help="time pagedgen's step parts: in the first timed pass on a CPU, in an extra untimed "
        "pass on a GPU (the timers synchronize it)",
    ),
    gpu_profile: bool = typer.Option(
        True, help="on cuda: GPU busy % and kernel launches per decode step, under torch.profiler"
    ),
    gpu_profile_steps: int = typer.Option(
        32, help="steps each GPU profile (decode, mixed) covers, at most"
    ),
    generate_batch_timeout: float = typer.Option(
        600.0, help="stop generate_batch after this many seconds; figures then cover the done"
    ),
    seed: int = typer.Option(0, help="seed of the random prompts and of sampling"),
    output_json: str | None = typer.Option(None, "--output-json", help="write the figures here"),
) -> None:
    """Benchmark pagedgen against transformers' generate on the same prompts, in one process.

    Prints requests/s, total tokens/s and output tokens/s for each engine, pagedgen's ratio to
    each baseline, how many requests produced identical greedy tokens, a roofline of this
    machine, the share of pagedgen's step time per engine part, and the machine's load. On cuda,
    a short extra pass profiles pagedgen's decode steps: GPU busy % and kernel launches per step.

    A workload file is JSON: "prompts", a list of token-id lists, and "max_tokens", one int per
    prompt (run greedy, ignoring eos). --save-workload writes one from any workload, so that a
    ShareGPT workload made where the dataset is installed runs the same on another machine.
    """
    from rich.console import Console
    from rich.markup import escape

    from pagedgen.entrypoints.bench.benchmark import BenchOptions, run_bench
    from pagedgen.entrypoints.bench.report import render
    from pagedgen.loader import ModelNotFoundError

    console = Console(width=None if sys.stdout.isatty() else 160)
    errors = Console(stderr=True)
    try:
        options = BenchOptions(
            model=model,
            workload=workload,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            baselines=[name.strip() for name in baselines.split(",") if name.strip()],
            dtype=dtype,
            device=device,
            num_threads=threads,
            num_iters=num_iters,
            kv_cache_memory=kv_cache_memory,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            kv_cache_dtype=kv_cache_dtype,
            enforce_eager=enforce_eager,
            async_scheduling=async_scheduling,
            roofline=roofline,
            overhead=overhead,
            gpu_profile=gpu_profile,
            gpu_profile_steps=gpu_profile_steps,
            generate_batch_timeout=generate_batch_timeout,
            seed=seed,
            save_workload=save_workload,
        )
        report = run_bench(options, log=lambda message: errors.print(message, highlight=False))
    except (ModelNotFoundError, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        errors.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
        raise typer.Exit(2) from e
    render(report, console)
    if output_json:
        with open(output_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
