from rich.console import Console
from rich.table import Table

from pagedgen.entrypoints.cli.summary import grammar_rows
from pagedgen.entrypoints.profile.profiler import ProfileReport
from pagedgen.entrypoints.tables import figures_table


def render_report(console: Console, report: ProfileReport) -> None:
    """The profile as rich tables: the pool, the workload, the run, contiguous, block sizes."""
    data = report.to_dict()
    kv, workload, run = data["kv_cache"], data["workload"], data["run"]

    pool = _pairs(f"KV cache of {report.model}")
    pool.add_row("bytes per token", f"{kv['bytes_per_token']:,} = {kv['formula']}")
    pool.add_row("block size", f"{kv['block_size']} tokens")
    pool.add_row(
        "pool",
        f"{kv['num_blocks']:,} blocks = {kv['num_tokens']:,} tokens ({kv['memory_gib']:.3f} GiB)",
    )
    pool.add_row("max_model_len", f"{kv['max_model_len']:,}")
    console.print(pool)

    load = _pairs("workload")
    load.add_row(
        "requests",
        f"{workload['num_requests']:,} ({workload['num_invalid']} invalid input records left out)",
    )
    load.add_row("mean prompt tokens", f"{workload['mean_prompt_tokens']:,.1f}")
    source = "reference completions" if workload["num_with_reference"] else "max_tokens"
    if report.mode == "real":
        source = "generated"
    load.add_row("mean output tokens", f"{workload['mean_output_tokens']:,.1f} ({source})")
    console.print(load)

    paged = _pairs(
        f"paged KV cache over the run ({'simulated' if report.mode == 'simulate' else 'measured'})"
    )
    paged.add_row("steps", f"{run['num_steps']:,}")
    paged.add_row("live-token utilization", _pct(run["live_token_utilization"]))
    paged.add_row("internal fragmentation", _pct(run["internal_fragmentation"]))
    paged.add_row(
        "pool usage mean / peak", f"{_pct(run['mean_pool_usage'])} / {_pct(run['peak_pool_usage'])}"
    )
    paged.add_row(
        "running sequences mean / peak", f"{run['mean_running']:,.1f} / {run['peak_running']}"
    )
    paged.add_row("preemptions", str(run["num_preemptions"]))
    paged.add_row(
        "prefix sharing savings",
        f"{_pct(run['prefix_sharing_savings'])} of blocks "
        f"(prefix cache hit rate {_pct(run['prefix_cache_hit_rate'])})",
    )
    if run.get("num_sliding_window_freed_blocks"):
        paged.add_row(
            "blocks freed out of the sliding window", f"{run['num_sliding_window_freed_blocks']:,}"
        )
    paged.add_row(
        "requests finished / rejected", f"{run['num_finished']:,} / {run['num_rejected']:,}"
    )
    for row in grammar_rows(run.get("structured_output")):
        paged.add_row(*row)
    console.print(paged)

    contiguous = figures_table("paged vs contiguous allocation, same memory")
    for column in (
        "allocation",
        "slots per\nsequence",
        "live-token\nutilization",
        "sequences\nthat fit",
    ):
        contiguous.add_column(column, justify="left" if column == "allocation" else "right")
    for row in run["contiguous"]:
        contiguous.add_row(
            row["allocation"],
            f"{row['slots_per_seq']:,.1f}",
            _pct(row["live_token_utilization"]),
            f"{row['num_seqs_that_fit']:,}",
        )
    console.print(contiguous)

    if report.block_sizes:
        sizes = figures_table(
            "block sizes at the same memory (simulated"
            + (" with the run's output lengths)" if report.mode == "real" else ")")
        )
        columns = (
            "block\nsize",
            "blocks",
            "utili-\nzation",
            "fragmen-\ntation",
            "pool\nmean",
            "pool\npeak",
            "preemp-\ntions",
            "running\nmean",
            "sharing\nsavings",
        )
        for column in columns:
            sizes.add_column(column, justify="right")
        for row in report.block_sizes:
            sizes.add_row(
                str(row["block_size"]),
                f"{row['num_blocks']:,}",
                _pct(row["live_token_utilization"]),
                _pct(row["internal_fragmentation"]),
                _pct(row["mean_pool_usage"]),
                _pct(row["peak_pool_usage"]),
                str(row["num_preemptions"]),
                f"{row['mean_running']:,.1f}",
                _pct(row["prefix_sharing_savings"]),
            )
        console.print(sizes)


def _pairs(title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    return table


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"
