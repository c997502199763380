"""The options commands share, each defined once: the input (built into an InputSpec), the
engine (an EngineConfig: engine_options.py), the common sampling options, and the help's panels."""

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import typer

from pagedgen.entrypoints.io.spec import DEFAULT_SPLIT, InputSpec

INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"
MODEL_PANEL = "Model"
KV_CACHE_PANEL = "KV cache"
SCHEDULER_PANEL = "Scheduler"
EXECUTION_PANEL = "Execution (device, threads, graphs, attention kernels)"
LORA_PANEL = 'LoRA adapters (a line\'s "lora" names one)'
SPECULATIVE_PANEL = "Speculative decoding"
POOLING_PANEL = "Pooling (embeddings and classifier scores)"
STRUCTURED_PANEL = "Structured output and reasoning (an input line's own overrides these)"
CHAT_PANEL = "Chat template (how input messages become prompts; vLLM's names)"
SAMPLING_PANEL = "Sampling (vLLM's names and defaults; an input line may set its own)"
RAY_PANEL = "Scale out (Ray Data: pip install 'pagedgen[ray]')"
# The help's order of the panels, as vLLM's EngineArgs; a command's own panels come after.
PANELS = (
    INPUT_PANEL,
    OUTPUT_PANEL,
    MODEL_PANEL,
    KV_CACHE_PANEL,
    SCHEDULER_PANEL,
    EXECUTION_PANEL,
    LORA_PANEL,
    SPECULATIVE_PANEL,
    POOLING_PANEL,
    STRUCTURED_PANEL,
    CHAT_PANEL,
    SAMPLING_PANEL,
    RAY_PANEL,
)


class OptionGroup(NamedTuple):
    """Options that a command receives built into one object, under one parameter."""

    param: str  # the command's parameter that receives the object
    build: Callable[..., Any]  # called with the options as keywords
    options: dict[str, tuple[Any, Any]]  # option parameter: (its type, typer.Option/Argument)
    # Hidden older names: alias parameter: (the option it sets, its type, a hidden typer.Option
    # defaulting to None); given, it wins over the option's default
    aliases: dict[str, tuple[str, Any, Any]] = {}


def option(panel: str, default: Any, *names: str, help: str, metavar: str | None = None) -> Any:
    """A typer option, listed in its panel's section of the help. A flag's help says its
    default itself."""
    return typer.Option(
        default,
        *names,
        help=help,
        metavar=metavar,
        rich_help_panel=panel,
        show_default=not isinstance(default, bool),
    )


input_option = functools.partial(option, INPUT_PANEL)
output_option = functools.partial(option, OUTPUT_PANEL)
sampling_option = functools.partial(option, SAMPLING_PANEL)
structured_option = functools.partial(option, STRUCTURED_PANEL)
lora_option = functools.partial(option, LORA_PANEL)


def _input(default: Any, help: str, metavar: str) -> Any:
    return input_option(default, help=help, metavar=metavar)


INPUT = OptionGroup(
    "spec",
    InputSpec,
    {
        "path": (
            str,
            typer.Argument(
                ...,
                metavar="INPUT",
                show_default=False,
                help="JSONL (pagedgen's or OpenAI batch), text, '-' for stdin, a dataset "
                "(save_to_disk folder, parquet/csv/json file, hub id in the local cache) or "
                "'sharegpt'",
                rich_help_panel=INPUT_PANEL,
            ),
        ),
        "input_format": (
            str,
            _input("auto", "auto (from the path), jsonl, openai, text, dataset or sharegpt", "FMT"),
        ),
        "split": (str, _input(DEFAULT_SPLIT, "the dataset split to read", "NAME")),
        "prompt_column": (str | None, _input(None, "dataset column holding the prompt", "COL")),
        "messages_column": (
            str | None,
            _input(None, "dataset column holding chat messages", "COL"),
        ),
        "id_column": (str | None, _input(None, "dataset column holding the request id", "COL")),
        "limit": (int | None, _input(None, "read at most N input records", "N")),
        "shard": (
            str | None,
            _input(None, "only the records at positions = I mod N (merge with 'merge')", "I/N"),
        ),
    },
)

MAX_TOKENS = sampling_option(256, help="most tokens to generate per completion", metavar="N")
TEMPERATURE = sampling_option(
    1.0, help="0 = greedy (deterministic); higher = more random", metavar="T"
)
N = sampling_option(1, "--n", "-n", help="completions per prompt", metavar="N")
SEED = sampling_option(
    None, help="sampling seed of each request, for reproducible samples", metavar="S"
)
IGNORE_EOS = sampling_option(False, "--ignore-eos", help="generate past the end-of-sequence token")


def with_options(*groups: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Gives a command each group's options; it receives each group built, as one parameter.

    A value the built object rejects (its ValueError) is a usage error naming the option.
    """

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        built = {group.param for group in groups}
        own = [p for p in signature.parameters.values() if p.name not in built]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
            for group in groups
            for name, (kind, info) in group.options.items()
        ]
        added += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
            for group in groups
            for name, (_, kind, info) in group.aliases.items()
        ]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            for group in groups:
                fields = {name: kwargs.pop(name) for name in group.options}
                for alias, (name, _, _) in group.aliases.items():
                    if (value := kwargs.pop(alias)) is not None:
                        fields[name] = value
                try:
                    kwargs[group.param] = group.build(**fields)
                except ValueError as e:
                    raise typer.BadParameter(str(e), param_hint=_option_named(e, fields)) from e
            return command(**kwargs)

        parameters = [*own, *added]
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


def _option_named(error: ValueError, fields: dict[str, Any]) -> str | None:
    """The option an error message starts with ("block_size must be ...", "compilation_config.
    cudagraph_mode must be ..."), if any."""
    first = str(error).split(" ", 1)[0].split(".", 1)[0]
    return f"'--{first.replace('_', '-')}'" if first in fields else None
