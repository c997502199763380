import json
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from pagedgen.cli.progress import RunProgress
from pagedgen.cli.summary import print_summary

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(slots=True)
class RunOptions:
    input: dict[str, Any]  # InputSpec fields
    output: str
    engine: dict[str, Any]  # EngineConfig fields
    sampling: dict[str, Any]  # SamplingParams fields
    resume: bool = False
    overwrite: bool = False
    order: str = "input"
    stats_json: str | None = None
    progress: bool = True


def run_job(options: RunOptions) -> int:
    """The `pagedgen run` command; returns its exit code."""
    console = Console(stderr=True, soft_wrap=True)
    from pagedgen import LLM, SamplingParams
    from pagedgen.batch.job import ORDERS, BatchJob
    from pagedgen.io.readers import open_input
    from pagedgen.io.resume import OutputFile
    from pagedgen.io.spec import InputError, InputSpec
    from pagedgen.loader import ModelNotFoundError

    def usage_error(error: Exception) -> int:
        console.print(f"[red]error:[/] {error}", highlight=False)
        return EXIT_USAGE

    try:
        SamplingParams(**options.sampling)
        if options.order not in ORDERS:
            raise ValueError(f"--order must be one of {ORDERS}, got {options.order!r}")
        if options.resume and options.overwrite:
            raise ValueError("--resume and --overwrite contradict each other")
        source = open_input(InputSpec(**options.input))
        output = OutputFile(options.output, options.resume, options.overwrite)
    except (ValueError, InputError) as e:
        return usage_error(e)
    try:
        try:
            llm = LLM(log=lambda message: console.print(message, highlight=False), **options.engine)
        except (ModelNotFoundError, ValueError, OSError) as e:
            return usage_error(e)
        job = BatchJob(llm, source, output, options.sampling, options.order)
        if output.state.done:
            console.print(f"resuming {output.path}: {len(output.state.done)} records kept")
        try:
            with _stop_on_sigint(job), RunProgress(console, options.progress) as progress:
                result = job.run(progress.update)
        except InputError as e:
            return usage_error(e)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            console.print("[red]error:[/] the output pipe was closed")
            return EXIT_SOME_FAILED
    finally:
        output.close()
    print_summary(console, result, options.output)
    if options.stats_json:
        summary = {**result.summary, "output": options.output, "interrupted": result.interrupted}
        summary["failed_lines"] = result.failed_lines
        with open(options.stats_json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    if result.interrupted:
        _print_resume_hint(console, options, result.num_records, source.total)
        return EXIT_INTERRUPTED
    return EXIT_SOME_FAILED if result.num_failed else EXIT_OK


@contextmanager
def _stop_on_sigint(job: Any) -> Iterator[None]:
    """Ctrl-C asks the job to stop (twice: at once); a third time interrupts as Python does."""

    def handler(signum: int, frame: Any) -> None:
        if job.num_stop_requests >= 2:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        job.stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _print_resume_hint(
    console: Console, options: RunOptions, num_records: int, total: int | None
) -> None:
    of_total = f" of {total}" if total is not None else ""
    console.print(f"interrupted: {num_records}{of_total} records are in {options.output}")
    if options.output == "-":
        console.print("the output went to stdout; run with -o FILE to be able to --resume")
        return
    args = [a for a in sys.argv[1:] if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    console.print(f"resume with: pagedgen {shlex.join(args)}", highlight=False, soft_wrap=True)
