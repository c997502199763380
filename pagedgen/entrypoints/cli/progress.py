import time
from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from pagedgen.entrypoints.batch.job import JobProgress
from pagedgen.entrypoints.cli.eta import EtaEstimator, format_eta

REFRESH_S = 0.25
LOG_EVERY_S = 5.0
RATE_WINDOW_S = 10.0


class LiveProgress:
    """A requests bar with an ETA above other lines, live on a terminal (rich), for the run
    progress displays; off a terminal they print a plain line now and then instead."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.live_display = enabled and console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
        )
        self.task = self.progress.add_task("run", total=None, eta=format_eta(None))
        self.last_log = time.perf_counter()

    def show(self, *lines: Text) -> None:
        self.live = Live(Group(self.progress, *lines), console=self.console, auto_refresh=False)

    def __enter__(self):
        if self.live_display:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live_display:
            self.live.refresh()
            self.live.stop()


class StartupStatus:
    """A spinner line on a terminal while the engine starts: what it does now (loading the
    model, capturing CPU graphs) and for how long; the startup lines print above it."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.live_display = enabled and console.is_terminal
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=None)

    def __enter__(self) -> "StartupStatus":
        if self.live_display:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live_display:
            self.progress.stop()

    def update(self, phase: str) -> None:
        self.progress.update(self.task, description=phase)


class RunProgress(LiveProgress):
    """Live progress on stderr: requests done of total with an ETA, prompt and generation
    tokens/s, running / waiting / swapped sequences, a KV-cache usage gauge, preemptions, the
    prefix-cache hit rate and, with speculative decoding, the drafts accepted. Off a terminal,
    one plain line every few seconds instead."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        super().__init__(console, enabled)
        self.throughput, self.cache = Text(), Text()
        self.show(self.throughput, self.cache)
        self.last_update = 0.0
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, prompt, generation tokens)
        self.eta = EtaEstimator()
        self.stops_seen = 0

    def update(self, progress: JobProgress) -> None:
        self._report_stop(progress)
        now = time.perf_counter()
        finished = progress.total is not None and progress.num_done >= progress.total
        if not self.enabled or (now - self.last_update < REFRESH_S and not finished):
            return
        self.last_update = now
        stats = progress.engine.stats
        self.samples.append((now, stats.num_prompt_tokens, stats.num_generation_tokens))
        while now - self.samples[0][0] > RATE_WINDOW_S and len(self.samples) > 2:
            self.samples.popleft()
        eta = self.eta.update(now, progress)
        throughput, cache = self.status_lines(progress)
        if self.live_display:
            self.progress.update(
                self.task, total=progress.total, completed=progress.num_done, eta=format_eta(eta)
            )
            for text, markup in ((self.throughput, throughput), (self.cache, cache)):
                text.plain = ""
                text.append_text(Text.from_markup(markup))
            self.live.refresh()
        elif now - self.last_log >= LOG_EVERY_S:
            self.last_log = now
            total = progress.total if progress.total is not None else "?"
            eta_text = f" · ETA {format_eta(eta)}" if eta is not None else ""
            plain = Text.from_markup(f"{throughput} · {cache}").plain
            self.console.print(
                f"{progress.num_done}/{total} requests{eta_text} · {plain}", highlight=False
            )

    def status_lines(self, progress: JobProgress) -> tuple[str, str]:
        stats = progress.engine.stats
        (t0, p0, g0), (t1, p1, g1) = self.samples[0], self.samples[-1]
        if t1 <= t0:  # one sample yet: the rate since the start
            t0, p0, g0 = t1 - progress.metrics.elapsed, 0, 0
        prompt_rate = (p1 - p0) / (t1 - t0)
        gen_rate = (g1 - g0) / (t1 - t0)
        usage = stats.kv_cache_usage_perc
        filled = round(usage * 10)
        color = "green" if usage < 0.8 else "yellow" if usage < 0.95 else "red"
        gauge = f"[{color}]{'█' * filled}[/][dim]{'░' * (10 - filled)}[/]"
        generated = f"gen {gen_rate:,.0f} tok/s · "
        if getattr(progress.engine, "pooler_config", None) is not None:  # a pooling job
            generated = ""
        throughput = (
            f"prompt {prompt_rate:,.0f} tok/s · {generated}"
            f"running {stats.num_running} · waiting {stats.num_waiting} · "
            f"swapped {stats.num_swapped}"
        )
        cache = (
            f"KV cache {gauge} {usage:.0%} · preemptions {stats.num_preemptions} · "
            f"prefix cache hit rate {stats.prefix_cache_hit_rate:.0%}"
        )
        if stats.spec_decode.num_draft_tokens:
            cache += f" · drafts accepted {stats.spec_decode.draft_acceptance_rate:.0%}"
        return throughput, cache

    def _report_stop(self, progress: JobProgress) -> None:
        engine = progress.engine
        stops = progress.num_stop_requests
        if stops == self.stops_seen:
            return
        self.stops_seen = stops
        if stops == 1:
            self.console.print(
                f"stopping: no new requests; finishing the {engine.num_unfinished_requests} "
                "started (a second Ctrl-C or SIGTERM stops at once)"
            )
        else:
            self.console.print("stopping now")
