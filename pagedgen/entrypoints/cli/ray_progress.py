import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pagedgen.entrypoints.batch.job import JobResult
from pagedgen.entrypoints.cli.eta import format_eta
from pagedgen.entrypoints.cli.progress import LiveProgress
from pagedgen.entrypoints.ray.stats import RayProgress

LOG_EVERY_S = 5.0


class RayRunProgress(LiveProgress):
    """Live progress of a Ray job on stderr, aggregated over the replicas as their records come
    back: records done of total with an ETA, output tokens/s, and each replica's count. Off a
    terminal, one plain line every few seconds instead."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        super().__init__(console, enabled)
        self.status = Text()
        self.show(self.status)
        self.num_done_at_start: int | None = None

    def update(self, progress: RayProgress) -> None:
        if not self.enabled:
            return
        if self.num_done_at_start is None:
            self.num_done_at_start = progress.num_done - progress.metrics.total("num_requests")
        metrics = progress.metrics
        made = progress.num_done - self.num_done_at_start
        seconds_left = None
        if progress.total is not None and made:
            seconds_left = max(progress.total - progress.num_done, 0) * metrics.elapsed / made
        eta = format_eta(seconds_left)
        counts = " · ".join(f"{name} {s.num_requests}" for name, s in metrics.replicas.items())
        status = (
            f"gen {metrics.total('num_output_tokens') / metrics.elapsed:,.0f} tok/s · "
            f"replicas: {counts or 'starting'}"
        )
        if self.live_display:
            self.progress.update(
                self.task, total=progress.total, completed=progress.num_done, eta=eta
            )
            self.status.plain = status
            self.live.refresh()
        elif time.perf_counter() - self.last_log >= LOG_EVERY_S:
            self.last_log = time.perf_counter()
            total = progress.total if progress.total is not None else "?"
            self.console.print(f"{progress.num_done}/{total} requests · ETA {eta} · {status}")


def print_ray_summary(console: Console, result: JobResult, output: str) -> None:
    """The end-of-run table of a Ray job: in total, then each replica's share."""
    s = result.summary
    table = Table(title="pagedgen run --ray", title_justify="left")
    for column in ("replica", "requests", "failed", "busy s", "requests/s", "output tokens/s"):
        table.add_column(column, justify="left" if column == "replica" else "right")
    for name, r in s["replicas"].items():
        table.add_row(
            name,
            str(r["num_requests"]),
            str(r["num_failed"]),
            f"{r['busy_s']:.1f}",
            f"{r['requests_per_s']:.2f}",
            f"{r['output_tokens_per_s']:,.1f}",
        )
    table.add_row(
        "[bold]total[/]",
        str(result.num_records),
        str(result.num_failed),
        f"{s['elapsed_s']:.1f}",
        f"{s['requests_per_s']:.2f}",
        f"{s['output_tokens_per_s']:,.1f}",
    )
    console.print(table)
    if result.num_resumed:
        console.print(f"{result.num_resumed} records kept from before (--resume)")
    if result.num_failed:
        lines = ", ".join(str(line) for line in result.failed_lines)
        more = ", ..." if result.num_failed > len(result.failed_lines) else ""
        console.print(
            f"{result.num_failed} failed (input lines {lines}{more}); their error records are "
            f"in {output}"
        )
