"""`pagedgen run --ray`: the run command's job on the replicas of a Ray cluster."""

import logging
import warnings
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape

from pagedgen.entrypoints.cli.checks import fill_closed_std_fds
from pagedgen.entrypoints.cli.ray_options import RayOptions
from pagedgen.entrypoints.cli.ray_progress import RayRunProgress, print_ray_summary
from pagedgen.entrypoints.cli.run_job import (
    EXIT_IO_ERROR,
    EXIT_OK,
    EXIT_SOME_FAILED,
    EXIT_USAGE,
    USAGE_ERRORS,
    RunOptions,
    _print_resume_hint,
    _report,
    _usage_error,
    check_options,
    generation_options,
    pools_prompts,
    print_model_sampling,
    take_model_sampling_defaults,
)
from pagedgen.entrypoints.cli.signals import Interrupted, StopSignals, stdout_reader_gone
from pagedgen.entrypoints.io import (
    InputSource,
    OutputFile,
    OutputWriteError,
    open_input,
    resume_source,
)
from pagedgen.entrypoints.io.parts import PartsOutput
from pagedgen.entrypoints.ray.config import ProcessorConfig, require_ray
from pagedgen.entrypoints.ray.job import RayJob
from pagedgen.loader import resolve_model


def run_ray_job(options: RunOptions, scale: RayOptions) -> int:
    """`pagedgen run --ray`; returns its exit code (those of `pagedgen run`)."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    fill_closed_std_fds()
    try:
        ray = require_ray()
    except ImportError as e:
        return _usage_error(console, e)
    with StopSignals() as signals:
        try:
            source, output = _claim(options, scale)
        except USAGE_ERRORS as e:
            return _usage_error(console, e)
        except Interrupted as e:
            console.print(f"interrupted ({e}) before the run started")
            return signals.exit_code
        if output.note is not None:
            console.print(escape(output.note))
        print_model_sampling(console, options)
        code, started = EXIT_USAGE, False
        try:
            started = start_ray(ray, scale.address)
            code = _run(options, scale, console, signals, source, output)
        except Interrupted as e:
            console.print(f"stopped at once ({e})")
            _print_resume_hint(console, options)
            code = signals.exit_code
        except ConnectionError as e:
            code = _usage_error(console, e)
        except BrokenPipeError:
            code = stdout_reader_gone(console)
        finally:
            try:
                output.close(keep=code in (EXIT_OK, EXIT_SOME_FAILED))
            except OutputWriteError as e:
                console.print(f"[red]error:[/] cannot write {escape(options.output)}: {e}")
                code = EXIT_IO_ERROR
            if started:
                ray.shutdown()
        return code


def _ray_errors() -> tuple[type[BaseException], ...]:
    """What a failed Ray job raises: Ray's errors, Ray Data's wrapper of a replica's, and ours
    for records that never came back."""
    import ray.exceptions
    from ray.data.exceptions import UserCodeException

    return ray.exceptions.RayError, UserCodeException, RuntimeError


def _gist(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def start_ray(ray: Any, address: str | None) -> bool:
    """Joins the cluster at address, or starts a local one; True if this call started Ray."""
    if ray.is_initialized():
        return False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    # Ray Data's advice on a job of fewer batches than replicas
    warnings.filterwarnings("ignore", message="The minimum number of concurrent actors")
    ray.init(
        address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False  # a field older Rays lack: setting it is harmless
    return True


def processor_config(options: RunOptions, scale: RayOptions, openai: bool) -> ProcessorConfig:
    engine = asdict(options.engine)
    return ProcessorConfig(
        model=engine.pop("model"),
        engine_kwargs=engine,
        sampling=options.sampling,
        concurrency=scale.replicas,
        batch_size=scale.batch_size,
        num_cpus=options.engine.num_threads or 1,
        num_gpus=1 if options.engine.device == "cuda" else 0,
        openai=openai,
        lora_modules={name: lora.lora_path for name, lora in options.loras.items()},
        chat_template=options.chat_template.chat_template,
        chat_template_kwargs=options.chat_template.chat_template_kwargs,
        tool_call_parser=options.tool_call_parser,
    )


def _claim(options: RunOptions, scale: RayOptions) -> tuple[InputSource, OutputFile | PartsOutput]:
    check_options(options)
    model_dir = resolve_model(
        options.engine.model, options.engine.download_dir, options.engine.revision
    ).path
    source = open_input(options.input)
    generation = generation_options(options, source.format)
    if not pools_prompts(options, model_dir):
        take_model_sampling_defaults(options, model_dir)
    if scale.output_format == "parts":
        if options.output == "-":
            raise ValueError("--output-format parts needs a folder, not stdout")
        output: OutputFile | PartsOutput = PartsOutput(
            options.output, options.resume, options.overwrite, generation
        )
    else:
        output = OutputFile(
            options.output, options.resume, options.overwrite, options.input.path, generation
        )
    return source, output


def _run(
    options: RunOptions,
    scale: RayOptions,
    console: Console,
    signals: StopSignals,
    source: InputSource,
    output: OutputFile | PartsOutput,
) -> int:
    try:
        reopen = None if options.input.path == "-" else lambda: open_input(options.input)
        source = resume_source(source, output.state, output.path, reopen)
        config = processor_config(options, scale, source.is_openai)
        job = RayJob(config, source, output, options.order)
    except USAGE_ERRORS as e:
        return _usage_error(console, e)
    if output.state.done:
        console.print(f"resuming {escape(output.path)}: {len(output.state.done)} records kept")
    signals.job = job
    try:
        with RayRunProgress(console, options.progress) as progress:
            result = job.run(progress.update)
    except _ray_errors() as e:  # a replica that cannot start (no model there), a lost cluster
        console.print(f"[red]error:[/] the Ray job failed: {escape(_gist(e))}")
        _print_resume_hint(console, options)
        return EXIT_USAGE
    return _report(console, options, result, signals, source.total, print_ray_summary)
