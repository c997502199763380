import json
import sys

import typer

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.cli import options as opt
from pagedgen.entrypoints.cli.engine_options import ENGINE

WORKLOAD_PANEL = "Workload"
BASELINES_PANEL = "Baselines"
REPORT_PANEL = "Report"


@opt.with_options(ENGINE)
def bench(
    engine: EngineConfig,
    workload: str = opt.option(
        WORKLOAD_PANEL,
        "sharegpt",
        help="sharegpt, fixed, latency (batch 1) or a workload FILE.json",
        metavar="W",
    ),
    save_workload: str | None = opt.option(
        WORKLOAD_PANEL,
        None,
        "--save-workload",
        help="write the workload run to this FILE.json, to run elsewhere",
        metavar="FILE",
    ),
    num_prompts: int = opt.option(
        WORKLOAD_PANEL, 64, help="requests (sharegpt, fixed)", metavar="N"
    ),
    input_len: int = opt.option(
        WORKLOAD_PANEL, 128, help="prompt tokens (fixed, latency)", metavar="N"
    ),
    output_len: int | None = opt.option(
        WORKLOAD_PANEL,
        None,
        help="output tokens [default: 128 fixed, 64 latency]",
        metavar="N",
    ),
    seed: int = opt.option(
        WORKLOAD_PANEL, 0, help="seed of the random prompts and of the engine", metavar="S"
    ),
    baselines: str = opt.option(
        BASELINES_PANEL,
        "static32,static64",
        help="comma-separated: static32, static64, generate_batch, vllm; '' for none",
        metavar="LIST",
    ),
    generate_batch_timeout: float = opt.option(
        BASELINES_PANEL,
        600.0,
        help="stop generate_batch after this many seconds; figures then cover the done",
        metavar="S",
    ),
    num_iters: int = opt.option(
        REPORT_PANEL,
        1,
        help="timed passes per engine, round robin; the fastest is kept",
        metavar="N",
    ),
    roofline: bool = opt.option(
        REPORT_PANEL,
        True,
        "--roofline/--no-roofline",
        help="measure matmul and copy speeds [default: on]",
    ),
    overhead: bool = opt.option(
        REPORT_PANEL,
        True,
        "--overhead/--no-overhead",
        help="time pagedgen's step parts: in the first timed pass on a CPU, in an extra untimed "
        "pass on a GPU (the timers synchronize it) [default: on]",
    ),
    gpu_profile: bool = opt.option(
        REPORT_PANEL,
        True,
        "--gpu-profile/--no-gpu-profile",
        help="on cuda: GPU busy % and kernel launches per decode step, under torch.profiler "
        "[default: on]",
    ),
    gpu_profile_steps: int = opt.option(
        REPORT_PANEL, 32, help="steps each GPU profile (decode, mixed) covers, at most", metavar="N"
    ),
    decode_parts: bool = opt.option(
        REPORT_PANEL,
        True,
        "--decode-parts/--no-decode-parts",
        help="on a CPU: time each part of a few decode steps (Linear roles, attention, the "
        "rest) against its bound [default: on]",
    ),
    output_json: str | None = opt.option(
        REPORT_PANEL, None, "--output-json", help="write the figures here", metavar="FILE"
    ),
) -> None:
    """Benchmark pagedgen against transformers' generate on the same prompts, in one process.

    Prints requests/s, total tokens/s and output tokens/s for each engine, pagedgen's ratio to
    each baseline, how many requests produced identical greedy tokens, a roofline of this
    machine, the share of pagedgen's step time per engine part, and the machine's load. On cuda,
    a short extra pass profiles pagedgen's decode steps: GPU busy % and kernel launches per step;
    on a CPU, one times each part of a decode step (Linear layers by role, attention, the rest of
    the forward, the rest of the step) against its bound.
    The baselines run pagedgen's model, dtype and device.

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
            engine=engine,
            workload=workload,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            baselines=[name.strip() for name in baselines.split(",") if name.strip()],
            num_iters=num_iters,
            roofline=roofline,
            overhead=overhead,
            gpu_profile=gpu_profile,
            gpu_profile_steps=gpu_profile_steps,
            decode_parts=decode_parts,
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
