import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.io.spec import InputSpec

EXIT_OK, EXIT_USAGE = 0, 2


@dataclass(slots=True)
class ProfileOptions:
    input: InputSpec
    engine: EngineConfig
    sampling: dict[str, Any]  # SamplingParams fields
    sampling_given: frozenset[str] = frozenset()  # fields set on the command line
    chat_template: ChatTemplate = ChatTemplate()
    simulate: bool = False
    block_sizes: str = "8,16,32,64,128"
    json_output: bool = False
    plot: str | None = None


def profile_job(options: ProfileOptions) -> int:
    """The `pagedgen profile` command; returns its exit code."""
    errors = Console(stderr=True, soft_wrap=True)
    from pagedgen.entrypoints.batch.requests import RequestBuilder
    from pagedgen.entrypoints.cli.run_job import describe_model_sampling, model_sampling
    from pagedgen.entrypoints.io.readers import open_input
    from pagedgen.entrypoints.io.spec import InputError
    from pagedgen.entrypoints.profile.profiler import build_workload
    from pagedgen.loader import ModelNotFoundError, resolve_model
    from pagedgen.pooling.config import job_task

    def log(message: str) -> None:
        errors.print(message, highlight=False)

    try:
        block_sizes = _block_sizes(options.block_sizes)
        config = options.engine
        source = open_input(options.input)
        if options.plot is not None:
            import matplotlib  # noqa: F401
    except ImportError:
        errors.print("[red]error:[/] --plot needs matplotlib: pip install 'pagedgen[plot]'")
        return EXIT_USAGE
    except (ValueError, InputError) as e:
        errors.print(f"[red]error:[/] {e}", highlight=False)
        return EXIT_USAGE
    if source.note:
        log(source.note)
    try:
        model_dir = resolve_model(config.model, config.download_dir, config.revision).path
        if job_task(config.runner, model_dir, config.hf_overrides) is not None:
            raise ValueError("profile measures generation; this model pools (--runner generate?)")
        llm, tokenizer, hf_config, max_model_len = _load(config, options.simulate, log)
        taken = model_sampling(options.sampling, options.sampling_given, config, model_dir)
        if taken:
            log(describe_model_sampling(taken))
        vocab_size = getattr(hf_config, "vocab_size", None) or len(tokenizer)
        builder = RequestBuilder(
            tokenizer,
            options.sampling,
            vocab_size,
            config.max_num_seqs,
            max_model_len,
            chat_template=options.chat_template,
        )
        log("reading and tokenizing the input")
        requests, workload = build_workload(source.records, builder, max_model_len)
        if not requests:
            raise ValueError("the input holds no request that can run")
        log(f"{len(requests)} requests; {'simulating' if llm is None else 'running'}")
        report = _profile(config, llm, hf_config, max_model_len, requests, workload, block_sizes)
    except (ModelNotFoundError, ValueError, OSError, InputError) as e:
        errors.print(f"[red]error:[/] {e}", highlight=False)
        return EXIT_USAGE
    if options.json_output:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        from pagedgen.entrypoints.cli.profile_view import render_report

        render_report(Console(width=None if sys.stdout.isatty() else 80), report)
    if options.plot is not None:
        from pagedgen.entrypoints.profile.plot import plot_report

        plot_report(report, options.plot)
        log(f"plot saved to {options.plot}")
    return EXIT_OK


def _load(config: Any, simulate: bool, log: Any) -> tuple[Any, Any, Any, int]:
    """An LLM for a real run; for a simulation only the tokenizer and the model's config."""
    if not simulate:
        from pagedgen import LLM

        llm = LLM(log=log, **asdict(config))
        engine = llm.engine
        return llm, llm.tokenizer, engine.hf_config, engine.max_model_len
    from pagedgen.core.control_plane import resolve_max_model_len
    from pagedgen.loader import resolve_model
    from pagedgen.loader.resolve import resolve_tokenizer
    from pagedgen.loader.weights import load_config, load_tokenizer

    resolved = resolve_model(config.model, config.download_dir, config.revision)
    hf_config = load_config(resolved, config.trust_remote_code, config.hf_overrides)
    return (
        None,
        load_tokenizer(
            resolve_tokenizer(config.tokenizer, resolved, config.download_dir),
            config.trust_remote_code,
        ),
        hf_config,
        resolve_max_model_len(hf_config, config.max_model_len),
    )


def _profile(
    config: Any,
    llm: Any,
    hf_config: Any,
    max_model_len: int,
    requests: list,
    workload: dict,
    block_sizes: list[int],
) -> Any:
    from pagedgen.entrypoints.profile.geometry import simulated_geometry, simulated_kv_bytes
    from pagedgen.entrypoints.profile.profiler import profile_real, profile_simulated

    if llm is None:
        geometry = simulated_geometry(config, hf_config)
        kv_bytes = simulated_kv_bytes(config)
        return profile_simulated(
            config, geometry, kv_bytes, max_model_len, requests, workload, block_sizes
        )
    return profile_real(llm, requests, workload, block_sizes)


def _block_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise ValueError(f"--block-sizes must be comma-separated integers, got {text!r}") from e
    bad = [size for size in sizes if size not in (8, 16, 32, 64, 128)]
    if bad:
        raise ValueError(f"block sizes must be 8, 16, 32, 64 or 128, got {bad}")
    return sizes
