import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pagedgen.engine.stats import EngineStats


class RunProgress:
    """A rich progress bar with throughput and KV-cache gauges; a plain log line off a terminal."""

    def __init__(self, console: Console, total: int | None, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.start = time.perf_counter()
        self.last_log = self.start
        self.live = enabled and console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]generating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("run", total=total, status="")

    def __enter__(self) -> "RunProgress":
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def status_line(self, stats: EngineStats) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return (
            f"prompt {stats.num_prompt_tokens / elapsed:,.0f} tok/s · "
            f"gen {stats.num_generation_tokens / elapsed:,.0f} tok/s · "
            f"running {stats.num_running} waiting {stats.num_waiting} "
            f"swapped {stats.num_swapped} · KV {stats.kv_cache_usage_perc:.0%} · "
            f"preempted {stats.num_preemptions}"
        )

    def update(self, completed: int, stats: EngineStats) -> None:
        if not self.enabled:
            return
        status = self.status_line(stats)
        if self.live:
            self.progress.update(self.task, completed=completed, status=status)
            return
        now = time.perf_counter()
        if now - self.last_log >= 5.0:
            self.last_log = now
            total = self.progress.tasks[0].total
            self.console.print(f"{completed}/{total if total is not None else '?'} done · {status}")
