import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedgen.cli.inputs import PromptRecord, open_input, read_jsonl
from pagedgen.cli.output import OrderedWriter, error_record, output_record
from pagedgen.cli.progress import RunProgress

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass(slots=True)
class RunOptions:
    input: str
    output: str
    engine: dict[str, Any]
    sampling: dict[str, Any]
    progress: bool = True


def run_batch(options: RunOptions) -> int:
    """The `pagedgen run` job; returns the exit code (0 all ok, 1 some failed, 2 usage)."""
    console = Console(stderr=True)
    try:
        from pagedgen import LLM, SamplingParams
        from pagedgen.loader import ModelNotFoundError

        params = SamplingParams(**options.sampling)
        stream = open_input(options.input)
        total = _count_lines(options.input)
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/] {e}")
        return EXIT_USAGE
    try:
        llm = LLM(log=lambda message: console.print(message, highlight=False), **options.engine)
    except (ModelNotFoundError, ValueError, OSError) as e:
        console.print(f"[red]error:[/] {e}")
        return EXIT_USAGE
    out = sys.stdout if options.output == "-" else open(options.output, "w", encoding="utf-8")  # noqa: SIM115
    writer = OrderedWriter(out)
    ids: dict[int, str] = {}

    def requests() -> Iterator[tuple[str, Any, Any]]:
        for index, record in enumerate(read_jsonl(stream)):
            prompt = _prompt_of(llm, record)
            if isinstance(prompt, PromptRecord):
                writer.put(index, error_record(record.id, record.line_number, prompt.error))
                continue
            ids[index] = record.id
            yield str(index), prompt, params

    start = time.perf_counter()
    with RunProgress(console, total, enabled=options.progress) as progress:
        for result in llm.stream(requests()):
            index = int(result.request_id)
            writer.put(index, output_record(ids.pop(index), result))
            progress.update(writer.num_written, llm.engine.stats)
    if out is not sys.stdout:
        out.close()
    _print_summary(console, llm, writer, time.perf_counter() - start)
    return EXIT_SOME_FAILED if writer.num_failed else EXIT_OK


def _prompt_of(llm: Any, record: PromptRecord) -> str | list[int] | PromptRecord:
    if record.error is not None:
        return record
    if record.messages is None:
        return record.prompt
    try:
        return llm.apply_chat_template(record.messages)
    except Exception as e:  # a template can reject any conversation it dislikes
        return record._replace(error=f"chat template failed: {e}")


def _count_lines(path: str) -> int | None:
    if path == "-":
        return None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _print_summary(console: Console, llm: Any, writer: OrderedWriter, elapsed: float) -> None:
    stats = llm.engine.stats
    table = Table(title="pagedgen run", show_header=False)
    table.add_row("requests", f"{writer.num_written} ({writer.num_failed} failed)")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    table.add_row("requests/s", f"{writer.num_written / elapsed:.2f}")
    table.add_row("output tokens/s", f"{stats.num_generation_tokens / elapsed:,.1f}")
    table.add_row("prompt tokens/s", f"{stats.num_prompt_tokens / elapsed:,.1f}")
    table.add_row("peak KV cache usage", f"{stats.peak_kv_cache_usage_perc:.1%}")
    table.add_row("preemptions", str(stats.num_preemptions))
    console.print(table)
