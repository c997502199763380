"""The options `run` and `profile` share, each defined once: the input (built into an InputSpec),
the model and engine (an EngineConfig), and the common sampling options."""

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import typer

from pagedgen.config import EngineConfig
from pagedgen.io.spec import InputSpec
from pagedgen.loader.resolve import DEFAULT_MODEL

INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"
SAMPLING_PANEL = "Sampling (vLLM's names and defaults; an input line may set its own)"
ENGINE_PANEL = "Model and engine"
STRUCTURED_PANEL = "Structured output (a line's structured_outputs or response_format overrides)"
LORA_PANEL = 'LoRA adapters (a line\'s "lora" names one)'


class OptionGroup(NamedTuple):
    """Options that a command receives built into one object, under one parameter."""

    param: str  # the command's parameter that receives the object
    build: Callable[..., Any]  # called with the options as keywords
    options: dict[str, tuple[Any, Any]]  # option parameter: (its type, typer.Option/Argument)


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
_engine = functools.partial(option, ENGINE_PANEL)


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
        "split": (str, _input("train", "the dataset split to read", "NAME")),
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

ENGINE = OptionGroup(
    "engine",
    EngineConfig,
    {
        "model": (
            str,
            _engine(
                DEFAULT_MODEL,
                "--model",
                "-m",
                help="local Hugging Face folder, hub id in the local cache, or .gguf file",
                metavar="MODEL",
            ),
        ),
        "dtype": (
            str,
            _engine(
                "auto", help="weights and KV cache: auto, float32, bfloat16, float16", metavar="T"
            ),
        ),
        "device": (str, _engine("auto", help="auto, cpu or cuda", metavar="DEVICE")),
        "block_size": (
            int,
            _engine(16, help="tokens per KV-cache block: a power of two up to 128", metavar="N"),
        ),
        "kv_cache_dtype": (
            str,
            _engine(
                "auto",
                help="KV-cache element type: auto (the model's dtype), fp8 (= fp8_e4m3) or "
                "fp8_e5m2, 8-bit floats that hold 2x the tokens of 16-bit ones",
                metavar="T",
            ),
        ),
        "kv_cache_memory": (
            float | None,
            _engine(
                None,
                help="KV-cache pool in GiB [default: 4 on a CPU; on a GPU, see "
                "--gpu-memory-utilization]",
                metavar="GIB",
            ),
        ),
        "max_num_seqs": (int, _engine(256, help="most sequences running at once", metavar="N")),
        "max_num_batched_tokens": (
            int | None,
            _engine(
                None, help="most tokens one step computes [default: the engine's]", metavar="N"
            ),
        ),
        "max_model_len": (
            int | None,
            _engine(None, help="longest prompt + completion [default: the model's]", metavar="N"),
        ),
        "attention_backend": (
            str,
            _engine("auto", help="auto, torch, cpu, cupy (CUDA) or reference", metavar="NAME"),
        ),
        "enable_prefix_caching": (
            bool,
            _engine(
                True,
                "--prefix-caching/--no-prefix-caching",
                help="share the KV blocks of prompts' common prefixes [default: on]",
            ),
        ),
        "enable_chunked_prefill": (
            bool,
            _engine(
                True,
                "--enable-chunked-prefill/--no-enable-chunked-prefill",
                help="split long prompts over steps, beside the running decodes [default: on]",
            ),
        ),
        "preemption_mode": (
            str,
            _engine("auto", help="when the KV cache is full: auto, recompute or swap", metavar="M"),
        ),
        "gpu_memory_utilization": (
            float,
            _engine(
                0.9,
                help="GPU: share of its memory to use; the KV cache gets what the weights and "
                "the largest step leave of it",
                metavar="F",
            ),
        ),
        "swap_space": (
            float,
            _engine(1.0, help="CPU pool for swapped-out KV blocks, in GiB", metavar="GIB"),
        ),
        "num_threads": (
            int | None,
            _engine(None, help="CPU threads [default: torch's choice]", metavar="N"),
        ),
        "trust_remote_code": (
            bool,
            _engine(
                False,
                "--trust-remote-code/--no-trust-remote-code",
                help="run the model folder's own Python for its config or tokenizer (auto_map), "
                "as transformers does with trust_remote_code [default: off]",
            ),
        ),
        "enforce_eager": (
            bool,
            _engine(
                False,
                "--enforce-eager/--no-enforce-eager",
                help="run every step eagerly, without the decode steps' CUDA graphs (GPU) "
                "or CPU graphs (up to 64 rows) [default: graphs]",
            ),
        ),
        "async_scheduling": (
            bool,
            _engine(
                False,
                "--async-scheduling/--no-async-scheduling",
                help="GPU: schedule the next step while the device runs this one [default: off]",
            ),
        ),
        "reasoning_parser": (
            str | None,
            _engine(
                None,
                help="the model reasons first: deepseek_r1, qwen3 or openai_gptoss (vLLM's); chat "
                "answers are split at </think> (gpt-oss: by harmony channel) into reasoning and "
                "content, structured output holds the part after it",
                metavar="NAME",
            ),
        ),
        "generation_config": (
            str,
            _engine(
                "auto",
                help="sampling defaults: auto (the model's generation_config.json, as vLLM), "
                "vllm (SamplingParams' own) or a folder holding a generation_config.json; a "
                "sampling option given here or on an input line wins over them",
                metavar="SRC",
            ),
        ),
        "override_generation_config": (
            str | None,
            _engine(
                None,
                help='fields over the generation config, JSON: {"temperature": 0.5}',
                metavar="JSON",
            ),
        ),
        "speculative_config": (
            str | None,
            _engine(
                None,
                help='speculative decoding by n-gram prompt lookup, vLLM\'s JSON: {"method": '
                '"ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
                metavar="JSON",
            ),
        ),
        "runner": (
            str,
            _engine(
                "auto",
                help="generate (completions) or pooling (an embedding, or a classifier's scores, "
                "per prompt); auto: pooling for a checkpoint without an LM head (LlamaModel, "
                "Qwen3Model) or a classifier (LlamaForSequenceClassification)",
                metavar="R",
            ),
        ),
        "pooler_config": (
            str | None,
            _engine(
                None,
                help='how --runner pooling pools, JSON: {"pooling_type": "LAST" | "MEAN" | '
                '"CLS", "use_activation": true (L2-normalize)} [default: the model\'s '
                "sentence-transformers files, else LAST, normalized]",
                metavar="JSON",
            ),
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

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            for group in groups:
                fields = {name: kwargs.pop(name) for name in group.options}
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
    """The option an error message starts with ("block_size must be ..."), if any."""
    first = str(error).split(" ", 1)[0]
    return f"'--{first.replace('_', '-')}'" if first in fields else None
