import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pagedgen.config import EngineConfig
from pagedgen.cpu_load import mark_start
from pagedgen.entrypoints.batch.job import ORDERS, BatchJob, JobResult
from pagedgen.entrypoints.batch.requests import sampling_defaults
from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.cli.checks import check_engine_fits, check_stats_json, fill_closed_std_fds
from pagedgen.entrypoints.cli.progress import RunProgress, StartupStatus
from pagedgen.entrypoints.cli.signals import Interrupted, StopSignals, stdout_reader_gone
from pagedgen.entrypoints.cli.summary import print_summary
from pagedgen.entrypoints.io import (
    InputError,
    InputSource,
    InputSpec,
    OutputFile,
    OutputWriteError,
    open_input,
    resume_source,
)
from pagedgen.entrypoints.io.generation_options import GenerationOptions
from pagedgen.entrypoints.lora_modules import max_rank_of, parse_lora_modules
from pagedgen.loader import ModelNotFoundError, resolve_model
from pagedgen.loader.generation_config import model_sampling_defaults
from pagedgen.lora.request import LoRARequest
from pagedgen.pooling.config import job_task

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_IO_ERROR = 74  # EX_IOERR of sysexits.h: the output (or --stats-json) could not be written
# Interrupted: 128 + the signal's number, as a shell tells: 130 SIGINT, 143 SIGTERM, 129 SIGHUP.
USAGE_ERRORS = (ValueError, InputError, ModelNotFoundError)


@dataclass(slots=True)
class RunOptions:
    input: InputSpec
    output: str
    engine: EngineConfig
    sampling: dict[str, Any]  # SamplingParams fields
    resume: bool = False
    overwrite: bool = False
    order: str = "input"
    stats_json: str | None = None
    progress: bool = True
    argv: list[str] = field(default_factory=list)  # the command line, for the resume hint
    loras: dict[str, LoRARequest] = field(default_factory=dict)  # --lora-modules, by name
    sampling_given: frozenset[str] = frozenset()  # fields set on the command line
    chat_template: ChatTemplate = ChatTemplate()  # --chat-template, --default-chat-template-kwargs
    tool_call_parser: str | None = None  # --tool-call-parser
    model_sampling: dict[str, Any] = field(default_factory=dict)  # taken from the model


# The engine options that change what is generated: the model (its revision and tokenizer), its
# weights' and KV cache's precision, the longest sequence, and how records are read from
# answers. The rest (device,
# threads, attention backend, graphs, batch and cache sizes, prefix caching, chunked prefill,
# speculative decoding, LoRA slots) change how the same requests are computed, not the requests.
_GENERATION_ENGINE_OPTIONS = (
    "model",
    "revision",
    "tokenizer",
    "trust_remote_code",
    "hf_overrides",
    "dtype",
    "kv_cache_dtype",
    "max_model_len",
    "runner",
    "pooler_config",
    "reasoning_parser",
    "generation_config",
    "override_generation_config",
)
_STRUCTURED_OPTIONS = "--json-schema/--regex/--choice"


def generation_options(options: RunOptions, input_format: str) -> GenerationOptions:
    """The options of the run that change what it generates, as --resume checks them: those
    above, the command line's sampling and structured output, the LoRA adapters, the chat
    template and its variables, the tool call parser, and how the input's records are read.
    Taken before the model's own sampling defaults are merged in (its generation config is
    among them)."""
    values: dict[str, object] = {}
    for name in _GENERATION_ENGINE_OPTIONS:
        values[_flag(name)] = getattr(options.engine, name)
    for name, value in options.sampling.items():
        values[_STRUCTURED_OPTIONS if name == "structured_outputs" else _flag(name)] = value
    values["--lora-modules"] = {name: lora.lora_path for name, lora in options.loras.items()}
    values["--chat-template"] = options.chat_template.chat_template
    values["--default-chat-template-kwargs"] = options.chat_template.chat_template_kwargs
    if options.chat_template.apply_to_prompts:  # (absent from outputs made before it was)
        values["--apply-chat-template"] = True
    values["--tool-call-parser"] = options.tool_call_parser
    spec = options.input
    values["--input-format"] = input_format
    for name in ("split", "prompt_column", "messages_column", "id_column", "shard"):
        values[_flag(name)] = getattr(spec, name)
    return GenerationOptions(values)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def pools_prompts(options: RunOptions, model_dir: Path) -> bool:
    """Whether the job pools (embeds or classifies: its engine is a pooling runner), checked
    before the model loads: then no sampling option applies."""
    if job_task(options.engine.runner, model_dir, options.engine.hf_overrides) is None:
        return False
    options.engine.check_pooling()
    given = sorted(options.sampling_given - {"structured_outputs"})
    if options.sampling.get("structured_outputs") is not None:
        given.append("json_schema")
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} is a sampling option; this job pools")
    if options.tool_call_parser is not None:
        raise ValueError("--tool-call-parser reads generated answers; this job pools")
    return True


def take_model_sampling_defaults(options: RunOptions, model_dir: Path) -> None:
    """The model's recommended sampling fields into options.sampling (see model_sampling)."""
    options.model_sampling = model_sampling(
        options.sampling, options.sampling_given, options.engine, model_dir
    )


def model_sampling(
    sampling: dict[str, Any], given: frozenset[str], engine: EngineConfig, model_dir: Path
) -> dict[str, Any]:
    """The model's recommended sampling fields (vLLM's generation_config) put into sampling,
    each where the command line set none; returns those put."""
    defaults = model_sampling_defaults(
        model_dir, engine.generation_config, engine.override_generation_config
    )
    taken = {name: value for name, value in defaults.items() if name not in given}
    sampling.update(taken)
    sampling_defaults(sampling)
    return taken


def print_model_sampling(console: Console, options: RunOptions) -> None:
    if options.model_sampling:
        console.print(describe_model_sampling(options.model_sampling))


def describe_model_sampling(taken: dict[str, Any]) -> str:
    return (
        f"sampling defaults from the model's generation config: {taken} "
        "(--generation-config vllm ignores it)"
    )


def lora_engine(
    engine: EngineConfig,
    specs: list[str],
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    max_cpu_loras: int | None = None,
) -> tuple[EngineConfig, dict[str, LoRARequest]]:
    """The engine config for --lora-modules (LoRA enabled, slots for every adapter and their
    largest rank unless asked otherwise) and the adapters by name."""
    loras = parse_lora_modules(specs)
    if not loras:
        if (max_loras, max_lora_rank, max_cpu_loras) != (None, None, None):
            raise ValueError("--max-loras, --max-lora-rank and --max-cpu-loras need --lora-modules")
        return engine, loras
    engine = replace(
        engine,
        enable_lora=True,
        max_loras=max_loras or len(loras),
        max_lora_rank=max_lora_rank or max_rank_of(loras),
        max_cpu_loras=max_cpu_loras,
    )
    return engine, loras


def run_job(options: RunOptions) -> int:
    """The `pagedgen run` command; returns its exit code.

    Every check a user can fail runs before the model loads. The output is claimed (locked, see
    OutputFile) before the model loads and written only once it has; a run that ends before
    writing a record leaves no output it created behind.
    """
    mark_start()
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    fill_closed_std_fds()
    with StopSignals() as signals:
        try:
            source, output = _claim(options)
        except USAGE_ERRORS as e:
            return _usage_error(console, e)
        except Interrupted as e:
            console.print(f"interrupted ({e}) before the run started")
            return signals.exit_code
        for note in (output.note, source and source.note):
            if note:
                console.print(escape(note))
        if source is None:
            return _no_records(console, options, output)
        print_model_sampling(console, options)
        code = EXIT_USAGE
        try:
            code = _run(options, console, signals, source, output)
        except Interrupted as e:  # a third signal, or one while the summary prints
            console.print(f"stopped at once ({e})")
            _print_resume_hint(console, options)
            code = signals.exit_code
        finally:
            try:
                output.close(keep=code in (EXIT_OK, EXIT_SOME_FAILED))
            except OutputWriteError as e:
                console.print(f"[red]error:[/] cannot write {escape(_where(options))}: {e}")
                code = EXIT_IO_ERROR
        return code


def _claim(options: RunOptions) -> tuple[InputSource | None, OutputFile]:
    """The input and the claimed output; the input is None where it holds no record and the
    output none to check it against, so that the run ends without loading the model."""
    check_options(options)
    check_engine_fits(options.engine)
    model_dir = resolve_model(
        options.engine.model, options.engine.download_dir, options.engine.revision
    ).path
    source = open_input(options.input)
    generation = generation_options(options, source.format)
    pools = pools_prompts(options, model_dir)
    output = OutputFile(
        options.output, options.resume, options.overwrite, options.input.path, generation
    )
    try:
        peeked = peek_records(source)
        if peeked is None and not output.state.done:
            return None, output
        if not pools:
            take_model_sampling_defaults(options, model_dir)
    except BaseException:
        output.close(keep=False)
        raise
    return peeked or source, output


def peek_records(source: InputSource) -> InputSource | None:
    """The input with its first record read (stdin: waited for), None if it holds none."""
    first = next(source.records, None)
    if first is None:
        return None
    return source._replace(records=chain([first], source.records))


def _no_records(console: Console, options: RunOptions, output: OutputFile) -> int:
    """An input without records: an output without records, and no model loaded."""
    try:
        output.stream  # noqa: B018  cut (with --overwrite) and its options kept, as a run's
        output.close()
    except OutputWriteError as e:
        console.print(f"[red]error:[/] cannot write {escape(_where(options))}: {e}")
        output.close(keep=False)
        return EXIT_IO_ERROR
    console.print(f"the input {escape(options.input.path)!r} holds no records; nothing to do")
    return EXIT_OK


def check_options(options: RunOptions) -> None:
    """The checks of the options alone, before anything is read or loaded."""
    if options.order not in ORDERS:
        raise ValueError(f"--order must be one of {ORDERS}, got {options.order!r}")
    if options.resume and options.overwrite:
        raise ValueError("--resume and --overwrite contradict each other")
    sampling_defaults(options.sampling)
    if options.stats_json is not None:
        check_stats_json(options.stats_json, options.input.path, options.output)


def _run(
    options: RunOptions,
    console: Console,
    signals: StopSignals,
    source: InputSource,
    output: OutputFile,
) -> int:
    from pagedgen import LLM

    where = _where(options)
    try:
        reopen = None if options.input.path == "-" else lambda: open_input(options.input)
        source = resume_source(source, output.state, output.path, reopen)
        with StartupStatus(console, options.progress) as startup:
            llm = LLM(log=console.print, status=startup.update, **asdict(options.engine))
        if signals.signum is not None:  # library code the signal struck swallowed Interrupted
            raise Interrupted(signals.signum)
        job = BatchJob(
            llm,
            source,
            output,
            options.sampling,
            options.order,
            options.loras,
            options.chat_template,
            options.tool_call_parser,
        )
    except OutputWriteError as e:  # the output's options could not be kept
        console.print(f"[red]error:[/] cannot write {escape(where)}: {e}")
        return EXIT_IO_ERROR
    except (*USAGE_ERRORS, OSError, RuntimeError, MemoryError) as e:  # no model, no memory
        return _usage_error(console, e)
    except Interrupted as e:
        console.print(f"interrupted ({e}) during start-up; nothing was written to {escape(where)}")
        return signals.exit_code
    if output.state.done:
        console.print(f"resuming {escape(output.path)}: {len(output.state.done)} records kept")
    signals.job = job
    try:
        with RunProgress(console, options.progress) as progress:
            result = job.run(progress.update)
    except InputError as e:
        return _usage_error(console, e)
    except BrokenPipeError:
        return stdout_reader_gone(console)
    return _report(console, options, result, signals, source.total)


def _report(
    console: Console,
    options: RunOptions,
    result: JobResult,
    signals: StopSignals,
    total: int | None,
    summary: Callable[[Console, JobResult, str], None] = print_summary,
) -> int:
    where = escape(_where(options))
    summary(console, result, options.output)
    code = EXIT_SOME_FAILED if result.num_failed else EXIT_OK
    if options.stats_json and not _write_stats(console, options, result):
        code = EXIT_IO_ERROR
    if result.write_error is not None:
        console.print(
            f"[red]error:[/] cannot write {where}: {result.write_error}; "
            f"its {result.num_records} records are whole"
        )
        _print_resume_hint(console, options)
        return EXIT_IO_ERROR
    if result.interrupted:
        of_total = f" of {total}" if total is not None else ""
        console.print(
            f"interrupted ({signals.name}): {result.num_records}{of_total} records are in {where}"
        )
        _print_resume_hint(console, options)
        return signals.exit_code
    return code


def _write_stats(console: Console, options: RunOptions, result: JobResult) -> bool:
    summary = {**result.summary, "output": options.output, "interrupted": result.interrupted}
    summary["failed_lines"] = result.failed_lines
    text = json.dumps(summary, indent=2) + "\n"
    try:
        if options.stats_json == "-":  # the records went to a file (see check_stats_json)
            print(text, end="", flush=True)
        else:
            Path(options.stats_json).write_text(text, encoding="utf-8")  # type: ignore[arg-type]
    except OSError as e:
        path = escape(str(options.stats_json))
        console.print(f"[red]error:[/] cannot write --stats-json {path}: {e.strerror}")
        return False
    return True


def _usage_error(console: Console, error: BaseException) -> int:
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    console.print(f"[red]error:[/] {escape(message)}")
    return EXIT_USAGE


def _where(options: RunOptions) -> str:
    return "stdout" if options.output == "-" else options.output


def _print_resume_hint(console: Console, options: RunOptions) -> None:
    if options.output == "-":
        console.print("the output went to stdout; run with -o FILE to be able to --resume")
        return
    args = [a for a in options.argv or sys.argv[1:] if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    console.print(f"resume with: pagedgen {escape(shlex.join(args))}", soft_wrap=True)
