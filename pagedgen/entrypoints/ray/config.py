from dataclasses import dataclass, field, fields
from typing import Any

from pagedgen.config import EngineConfig
from pagedgen.loader.resolve import DEFAULT_MODEL

RAY_MISSING = "Ray is not installed; install it with: pip install 'pagedgen[ray]'"


@dataclass(slots=True)
class ProcessorConfig:
    """What build_processor builds, in the shape of ray.data.llm's processor configs.

    engine_kwargs are LLM's (EngineConfig fields); sampling holds the SamplingParams fields every
    row starts from, a row's own fields override them. concurrency replicas each hold one LLM and
    take batch_size rows at a time; each asks Ray for num_cpus CPUs (its torch threads, unless
    engine_kwargs set num_threads) and num_gpus GPUs (0, or 1 to run on its own GPU).
    """

    model: str = DEFAULT_MODEL
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 1
    batch_size: int = 64
    num_cpus: float = 1
    num_gpus: float = 0
    openai: bool = False  # rows are OpenAI batch requests; records are OpenAI batch responses
    # LoRA adapters rows may name ("lora"; an OpenAI body's "model"): name -> PEFT folder, on
    # every node. They need engine_kwargs' enable_lora.
    lora_modules: dict[str, str] = field(default_factory=dict)
    chat_template: str | None = None  # Jinja text in place of the tokenizer's
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # every row's defaults
    tool_call_parser: str | None = (
        None  # reads chat answers' tool calls (pagedgen/entrypoints/io/tools.py)
    )

    def __post_init__(self) -> None:
        names = {f.name for f in fields(EngineConfig)} - {"model"}
        unknown = sorted(set(self.engine_kwargs) - names)
        if unknown:
            raise ValueError(f"unknown engine_kwargs {unknown}; known: {sorted(names)}")
        EngineConfig(model=self.model, **self.engine_kwargs)  # its own checks
        if self.lora_modules and not self.engine_kwargs.get("enable_lora"):
            raise ValueError("lora_modules need engine_kwargs enable_lora=True")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_cpus <= 0:
            raise ValueError(f"num_cpus must be > 0, got {self.num_cpus}")
        if self.num_gpus not in (0, 1) and not 0 < self.num_gpus < 1:
            raise ValueError(f"num_gpus must be 0, a fraction or 1, got {self.num_gpus}")

    @property
    def engine_config(self) -> EngineConfig:
        kwargs = dict(self.engine_kwargs)
        if kwargs.get("num_threads") is None:
            kwargs["num_threads"] = max(1, int(self.num_cpus))
        if self.num_gpus and kwargs.get("device", "auto") == "auto":
            kwargs["device"] = "cuda"
        return EngineConfig(model=self.model, **kwargs)


def require_ray() -> Any:
    """The ray module, or ImportError naming the extra that installs it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise ImportError(RAY_MISSING) from e
    return ray
