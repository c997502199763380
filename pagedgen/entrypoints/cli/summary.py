from typing import Any

from rich.console import Console
from rich.table import Table

from pagedgen.cpu_load import BUSY_CPUS
from pagedgen.entrypoints.batch.job import JobResult


def print_summary(console: Console, result: JobResult, output: str) -> None:
    """The end-of-run table: what was written, how fast, and how the KV cache was used."""
    s = result.summary
    table = Table(title="pagedgen run", show_header=False, title_justify="left")
    failed = f"{result.num_failed} failed" if result.num_failed else "all succeeded"
    table.add_row("requests", f"{result.num_records} ({failed})")
    if result.num_resumed:
        table.add_row("kept from before (--resume)", str(result.num_resumed))
    table.add_row("elapsed", f"{s['elapsed_s']:.1f} s")
    table.add_row("requests/s", f"{s['requests_per_s']:.2f}")
    pools = s.get("runner") == "pooling"  # no output tokens
    if not pools:
        table.add_row("output tokens/s", f"{s['output_tokens_per_s']:,.1f}")
    table.add_row("prompt tokens/s", f"{s['prompt_tokens_per_s']:,.1f}")
    table.add_row(
        "latency mean / p90", f"{_seconds(s['mean_latency_s'])} / {_seconds(s['p90_latency_s'])}"
    )
    if not pools:
        table.add_row("time to first token, mean", _seconds(s["mean_time_to_first_token_s"]))
    table.add_row(
        "KV cache usage peak / mean",
        f"{s['peak_kv_cache_usage_perc']:.1%} / {s['mean_kv_cache_usage_perc']:.1%}",
    )
    table.add_row("preemptions", str(s["num_preemptions"]))
    table.add_row("prefix cache hit rate", f"{s['prefix_cache_hit_rate']:.1%}")
    for row in grammar_rows(s.get("structured_output")):
        table.add_row(*row)
    if "spec_decode" in s:
        spec = s["spec_decode"]
        table.add_row(
            "drafts accepted (n-gram)",
            f"{spec['num_accepted_tokens']:,} of {spec['num_draft_tokens']:,} "
            f"({spec['draft_acceptance_rate']:.1%}); {spec['mean_acceptance_length']:.2f} "
            "tokens per verifying step",
        )
    console.print(table)
    if s.get("others_busy_cpus", 0.0) >= BUSY_CPUS:
        console.print(
            f"[yellow]note:[/] other processes kept {s['others_busy_cpus']:.1f} of the "
            f"{s['num_cpus']} CPUs busy during the run: these figures are below what this machine "
            "gives when quiet"
        )
    if result.num_failed:
        lines = ", ".join(str(line) for line in result.failed_lines)
        more = ", ..." if result.num_failed > len(result.failed_lines) else ""
        where = "stdout" if output == "-" else output
        console.print(
            f"{result.num_failed} failed (input lines {lines}{more}); their error records are "
            f"in {where}",
            highlight=False,
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def grammar_rows(grammar: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The summary's structured output rows: compile and mask times (none without a grammar)."""
    if grammar is None:
        return []
    return [
        (
            "grammars compiled (cache hits)",
            f"{grammar['num_grammars_compiled']} ({grammar['num_grammar_cache_hits']}), "
            f"{grammar['grammar_compile_ms_mean']:.2f} ms each",
        ),
        (
            "grammar mask per step",
            f"{grammar['grammar_mask_ms_per_step']:.2f} ms for {grammar['mean_masked_rows']:.1f} "
            "rows on average",
        ),
    ]
