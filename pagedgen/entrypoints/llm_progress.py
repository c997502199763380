import time
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.outputs import EmbeddingRequestOutput, RequestOutput

REFRESH_S = 0.1  # tqdm's mininterval


def stderr_console() -> Console:
    return Console(stderr=True)


class PromptProgress:
    """vLLM's `use_tqdm` bar for one LLM call, drawn with rich on stderr, the bar as wide as
    the terminal lets it be:

        Processed prompts  50% ━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 2/4 0:00:01 < 0:00:01 1.98 it/s
        est. speed input: 15.84 toks/s, output: 31.68 toks/s

    Prompts done of total, elapsed and remaining time, prompts/s, then, as vLLM estimates them,
    input tokens/s (each prompt counted once per completion) and output tokens/s (every
    completion's tokens) since the call began. The speeds have their own line so that an
    80-column terminal still shows every figure. It is redrawn as requests finish and, at most
    every REFRESH_S, after engine steps, so the clock runs between them.

    Drawn only where stderr is an interactive terminal; anywhere else (a file, a pipe, a test
    capturing stderr) it writes nothing at all. Used as a context manager: leaving it, by an
    exception too, draws the last count and ends the live display.
    """

    def __init__(self, num_prompts: int, enabled: bool = True) -> None:
        console = stderr_console() if enabled else None
        self.enabled = console is not None and console.is_interactive
        self.num_prompts = num_prompts
        self.num_done = 0
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0
        self.start = self.last_refresh = time.perf_counter()
        if not self.enabled:
            return
        self.progress = Progress(
            TextColumn("Processed prompts"),
            TaskProgressColumn(),
            BarColumn(bar_width=None, table_column=Column(ratio=1)),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("<"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[prompts_per_s]}"),
            console=console,
            expand=True,
        )
        self.task = self.progress.add_task("prompts", total=num_prompts, prompts_per_s="")
        self.speed = Text()
        self.live = Live(Group(self.progress, self.speed), console=console, auto_refresh=False)

    def update(self, output: RequestOutput | EmbeddingRequestOutput) -> None:
        """Counts a finished request; a rejected one (output.error) adds no tokens."""
        self.num_done += 1
        if output.error is None:
            num_samples = len(output.outputs) if isinstance(output, RequestOutput) else 1
            self.num_prompt_tokens += output.num_prompt_tokens * num_samples
            self.num_output_tokens += output.num_output_tokens
        if self.enabled:
            self.refresh(force=self.num_done == self.num_prompts)

    def on_step(self, engine: LLMEngine) -> None:
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last_refresh < REFRESH_S:
            return
        self.last_refresh = now
        self._set_figures(now)
        self.live.refresh()

    def _set_figures(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        prompts_per_s = f"{self.num_done / elapsed:.2f} it/s"
        self.progress.update(self.task, completed=self.num_done, prompts_per_s=prompts_per_s)
        self.speed.plain = (
            f"est. speed input: {self.num_prompt_tokens / elapsed:.2f} toks/s, "
            f"output: {self.num_output_tokens / elapsed:.2f} toks/s"
        )

    def __enter__(self) -> "PromptProgress":
        if self.enabled:
            self.live.start()
            self.refresh(force=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.enabled:  # Live.stop draws the last figures, undoes the redirection of stdout
            self._set_figures(time.perf_counter())  # and stderr and shows the cursor again
            self.live.stop()
