from rich.console import Console

from pagedgen.entrypoints.bench.cpu_decode_parts import decode_parts_table
from pagedgen.entrypoints.bench.decode_bound import decode_bound_line
from pagedgen.entrypoints.bench.overhead import PARTS
from pagedgen.entrypoints.tables import figures_table


def render(report: dict, console: Console) -> None:
    """Prints a `run_bench` report: machine state, roofline, figures, ratios, overhead."""
    machine, workload = report["machine"], report["workload"]
    console.print(
        f"[bold]pagedgen bench[/] {report['model']} on {machine['cpu']} {machine.get('isa', '')} "
        f"({machine['num_threads']} threads of {machine['num_cpus']} CPUs, "
        f"torch {machine['torch']})",
        highlight=False,
    )
    console.print(
        f"workload {workload['name']}: {workload['num_requests']} requests, "
        f"{workload['num_prompt_tokens']} prompt + {workload['num_output_tokens']} output tokens "
        f"(prompt ≤ {workload['max_prompt_len']}, output ≤ {workload['max_output_len']}; "
        f"{workload['prompt_format']}; greedy, ignore_eos)",
        highlight=False,
    )
    engine = report["engine"]
    console.print(
        f"pagedgen: {engine['dtype']}, max_num_seqs {engine['max_num_seqs']}, "
        f"max_num_batched_tokens {engine['max_num_batched_tokens']}, "
        f"{engine['num_blocks']} KV blocks of {engine['block_size']} tokens"
        + (f" ({engine['kv_cache_dtype']})" if engine.get("kv_cache_dtype") else "")
        + (f"; decode steps from {engine['decode_graphs']}" if engine.get("decode_graphs") else ""),
        highlight=False,
    )
    console.print(_machine_line("start", report["machine_start"], "since boot"), highlight=False)
    if report.get("roofline"):
        console.print(_roofline_line(report["roofline"]), highlight=False)
    if "latency" in report:
        _render_latency(report["latency"], console)
    else:
        _render_throughput(report, console)
        if report.get("overhead"):
            _render_overhead(report["overhead"], console)
    if report.get("gpu_profile"):
        console.print(gpu_profile_line(report["gpu_profile"]), highlight=False)
        if report["gpu_profile"].get("bound"):
            console.print(decode_bound_line(report["gpu_profile"]["bound"]), highlight=False)
    if report.get("gpu_profile_mixed"):
        console.print(gpu_profile_line(report["gpu_profile_mixed"]), highlight=False)
    if report.get("cpu_decode_parts"):
        console.print(decode_parts_table(report["cpu_decode_parts"]))
    console.print(_machine_line("end", report["machine_end"], "during the bench"), highlight=False)


def _machine_line(when: str, state: dict, span: str) -> str:
    load = " ".join(f"{x:.2f}" for x in state["loadavg"])
    return (
        f"machine at {when}: load average {load}; CPU steal {state['steal_perc']:.1f}% and other "
        f"processes' CPU {state['others_busy_perc']:.1f}% {span}"
    )


def _roofline_line(roof: dict) -> str:
    sizes = ", ".join(f"{shape} {g:.0f}" for shape, g in roof["matmul_gflops"].items())
    mm = ", ".join(f"{g:.0f}" for g in roof.get("mm_gflops", {}).values())
    return (
        f"roofline: matmul {sizes} GFLOP/s (torch.mm: {mm}; peak {roof['peak_gflops']:.0f}); copy "
        f"{roof['copy_gbps']:.1f} GB/s; model {roof['flops_per_token'] / 1e6:.4g} MFLOP/token, "
        f"{roof['weight_bytes_per_step'] / 1e6:.4g} MB weights/decode step -> at most "
        f"{roof['max_tokens_per_s']:,.0f} tokens/s compute-bound, "
        f"{roof['max_decode_steps_per_s']:.1f} decode steps/s bandwidth-bound"
    )


def gpu_profile_line(profile: dict) -> str:
    steps = f"{profile['num_steps']} {profile.get('phase', 'decode')} steps"
    if not profile["num_steps"]:
        return f"GPU profile: no {profile.get('phase', 'decode')} step ran in the profiled window"
    if profile["busy_perc"] is None:
        return (
            f"GPU profile: torch.profiler traced no device activity over {steps} "
            "(is CUPTI available?)"
        )
    line = (
        f"GPU busy {profile['busy_perc']:.1f} % over {steps} "
        f"({1000 * profile['window_s']:.1f} ms, under torch.profiler); "
        f"{profile['kernel_launches_per_step']:,.0f} kernel launches a step "
        f"({profile['graph_launches_per_step']:.3g} graph replays)"
    )
    if profile.get("plain_busy_perc") is not None:
        line += (
            f"; {profile['plain_busy_perc']:.1f} % of their "
            f"{1000 * profile['plain_step_s']:.2f} ms a step unprofiled"
        )
    if profile.get("sync_wait_perc") is not None:
        line += f"; the host waited for the device {profile['sync_wait_perc']:.1f} % of them"
    return line + "".join(kernel_lines(profile)) + host_line(profile)


def kernel_lines(profile: dict, top: int = 6) -> list[str]:
    """The kernels with the most device time, per step and as a share of the steps."""
    steps, window_s = profile["num_steps"], profile["window_s"]
    return [
        f"\n  {1000 * seconds / steps:8.3f} ms/step {100 * seconds / window_s:5.1f} %  {label}"
        for label, seconds in list(profile.get("kernel_s", {}).items())[:top]
    ]


def host_line(profile: dict) -> str:
    """The host's time a step in each part of it (the StepTimer sections)."""
    parts = profile.get("host_s") or {}
    steps = profile["num_steps"]
    if not parts:
        return ""
    return "\n  host ms/step: " + ", ".join(
        f"{part} {1000 * seconds / steps:.2f}" for part, seconds in parts.items()
    )


def _render_throughput(report: dict, console: Console) -> None:
    table = figures_table("throughput (vLLM bench throughput figures)")
    for column in ("engine", "requests\n/s", "total\ntokens/s", "output\ntokens/s", "elapsed\ns"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    table.add_column("% matmul\npeak", justify="right")
    table.add_column("others'\nCPU %", justify="right")
    table.add_column("steal\n%", justify="right")
    for name, run in report["runs"].items():
        share = run.get("matmul_peak_share")
        label = name + "".join(f" ({run[k]})" for k in ("engine", "note") if run.get(k))
        others, steal = run.get("others_busy_perc"), run.get("steal_perc")
        table.add_row(
            label,
            f"{run['requests_per_s']:.3f}",
            f"{run['total_tokens_per_s']:,.1f}",
            f"{run['output_tokens_per_s']:,.1f}",
            f"{run['elapsed_s']:.1f}",
            "" if share is None else f"{100 * share:.1f}",
            "" if others is None else f"{others:.1f}",  # none for a baseline run elsewhere
            "" if steal is None else f"{steal:.1f}",
        )
    console.print(table)
    if not report["ratios"]:
        return
    table = figures_table("pagedgen / baseline")
    for column in ("baseline", "requests\n/s", "total\ntokens/s", "output\ntokens/s", "identical"):
        table.add_column(column, justify="left" if column == "baseline" else "right")
    for name, ratio in report["ratios"].items():
        same = report["agreement"].get(name)
        identical = (
            f"{same['num_identical_requests']}/{same['num_requests']} requests, "
            f"{same['num_matching_prefix_tokens']}/{same['num_tokens']} tokens"
            if same
            else "n/a"
        )
        table.add_row(
            name,
            f"{ratio['requests_per_s']:.2f}x",
            f"{ratio['total_tokens_per_s']:.2f}x",
            f"{ratio['output_tokens_per_s']:.2f}x",
            identical,
        )
    console.print(table)


def _render_overhead(overhead: dict, console: Console) -> None:
    table = figures_table("pagedgen step time by part, timed in the pagedgen run")
    table.add_column("")
    for kind in overhead:
        table.add_column(kind.replace("_", " "), justify="right")
    rows = overhead.values()
    table.add_row("steps", *(str(row["num_steps"]) for row in rows))
    table.add_row(
        "mean / max seqs", *(f"{r['mean_num_seqs']:.1f} / {r['max_num_seqs']}" for r in rows)
    )
    table.add_row("mean tokens", *(f"{row['mean_num_tokens']:.1f}" for row in rows))
    table.add_row("ms / step", *(f"{row['mean_step_ms']:.1f}" for row in rows))
    for part in PARTS:
        table.add_row(f"% {part}", *(f"{100 * row['shares'][part]:.2f}" for row in rows))
    console.print(table)


def _render_latency(runs: dict, console: Console) -> None:
    table = figures_table("batch-1 latency")
    columns = ("engine", "TTFT\nms", "decode\nms/token", "decode\ntokens/s", "output\ntokens/s")
    for column in (*columns, "% band-\nwidth bound", "pagedgen decode\nspeedup"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for name, run in runs.items():
        share = run.get("bandwidth_share")
        speedup = run.get("pagedgen_decode_speedup")
        table.add_row(
            name,
            f"{1000 * run['time_to_first_token_s']:.1f}",
            f"{run['decode_latency_ms_per_token']:.2f}",
            f"{run['decode_tokens_per_s']:.1f}",
            f"{run['output_tokens_per_s']:.1f}",
            "" if share is None else f"{100 * share:.1f}",
            "" if speedup is None else f"{speedup:.2f}x",
        )
    console.print(table)
