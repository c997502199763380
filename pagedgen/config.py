import secrets
from dataclasses import dataclass, fields
from typing import Any

from pagedgen.json_args import json_object
from pagedgen.pooling.config import RUNNERS, resolve_pooler_config
from pagedgen.spec_decode.config import SpeculativeConfig

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's
# Weights' format on the CPU: None, the checkpoint's own (float, or a quantized checkpoint's
# integers); "none" computes in float (a quantized checkpoint dequantized); int8 / int4 quantize a
# float checkpoint's linear layers at load (pagedgen/layers/quantized_linear.py).
QUANTIZATIONS = ("none", "int8", "int4")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's (attention/kv_cache_dtype.py)
REASONING_PARSERS = ("deepseek_r1", "qwen3", "openai_gptoss")  # vLLM's (io/reasoning.py)
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "cupy", "reference")
PREEMPTION_MODES = ("auto", "recompute", "swap")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CUDAGRAPH_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # of vLLM's, those we run
MAX_CUDAGRAPH_CAPTURE_SIZE = 512  # vLLM's largest capture size


@dataclass(frozen=True, slots=True)
class CudaAttentionConfig:
    """Which of our CUDA attention kernels the cupy backend takes (--cuda-attention-config, a
    JSON object of these fields). None leaves the choice to the kernels' own rules, measured per
    shape; True takes the kernel for every layer it can run, False for none.

    prefill_kernel: one prefill attention launch per layer (kernels/prefill_attention.cu) rather
    than PyTorch's SDPA per sequence. grouped_decode: one thread block per kv head for its whole
    GQA group (kernels/paged_attention_grouped.cu). l2_prefetch: decode warps ask L2 for their
    next KV block. tensor_core_decode, tensor_core_prefill: the tensor-core kernels
    (paged_attention_mma.cu, prefill_attention_mma.cu; sm_80 or newer, 16-bit caches).
    decode_longest_first: the tensor-core decode kernel takes a step's sequences longest first,
    so that a long one does not finish alone after the rest."""

    prefill_kernel: bool = True
    grouped_decode: bool | None = None
    l2_prefetch: bool | None = None
    tensor_core_decode: bool | None = None
    tensor_core_prefill: bool | None = None
    decode_longest_first: bool = False

    @classmethod
    def parse(
        cls, value: "CudaAttentionConfig | dict[str, Any] | str | None"
    ) -> "CudaAttentionConfig":
        """From a CudaAttentionConfig, a dict of its fields or their JSON; None: the defaults."""
        if isinstance(value, CudaAttentionConfig):
            return value
        options = _config_fields(cls, "cuda_attention_config", value)
        for name, option in options.items():
            optional = name not in ("prefill_kernel", "decode_longest_first")
            if not isinstance(option, bool) and not (optional and option is None):
                raise ValueError(
                    f"cuda_attention_config.{name} must be true or false, got {option!r}"
                )
        return cls(**options)


@dataclass(frozen=True, slots=True)
class CompilationConfig:
    """Which steps replay graphs rather than run eagerly (--compilation-config, a JSON object of
    these fields; vLLM's names). With enforce_eager none does.

    cudagraph_mode: "FULL_DECODE_ONLY" replays decode-only steps from whole-step graphs (CUDA
    graphs on a GPU; recorded CPU graphs of up to 64 rows on a CPU) and runs the other steps
    eagerly; "FULL_AND_PIECEWISE" also runs the steps with prefill rows from piecewise graphs
    (worker/piecewise_graphs.py): the pieces between attention calls replay, attention runs
    eagerly over the step's own metadata. None: FULL_AND_PIECEWISE on a GPU, FULL_DECODE_ONLY
    on a CPU. max_cudagraph_capture_size: on a GPU, the most tokens of a step the piecewise
    graphs serve (also capped by max_num_batched_tokens); longer steps run eagerly. On a CPU
    the pieces serve steps of up to 64 tokens."""

    cudagraph_mode: str | None = None
    max_cudagraph_capture_size: int = MAX_CUDAGRAPH_CAPTURE_SIZE

    def __post_init__(self) -> None:
        if self.cudagraph_mode is not None and self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(
                f"compilation_config.cudagraph_mode must be one of {CUDAGRAPH_MODES}, "
                f"got {self.cudagraph_mode!r}"
            )
        size = self.max_cudagraph_capture_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"compilation_config.max_cudagraph_capture_size must be an integer >= 1, "
                f"got {size!r}"
            )

    def piecewise(self, on_gpu: bool) -> bool:
        """Whether steps with prefill rows run from piecewise graphs on this device."""
        mode = self.cudagraph_mode or ("FULL_AND_PIECEWISE" if on_gpu else "FULL_DECODE_ONLY")
        return mode == "FULL_AND_PIECEWISE"

    @classmethod
    def parse(cls, value: "CompilationConfig | dict[str, Any] | str | None") -> "CompilationConfig":
        """From a CompilationConfig, a dict of its fields or their JSON; None: the defaults."""
        if isinstance(value, CompilationConfig):
            return value
        return cls(**_config_fields(cls, "compilation_config", value))


def _config_fields(cls: type, name: str, value: dict[str, Any] | str | None) -> dict[str, Any]:
    """value (a dict or its JSON) as the fields of the config class cls; unknown ones fail."""
    options = json_object(name, value) or {}
    names = {field.name for field in fields(cls)}
    if unknown := sorted(set(options) - names):
        raise ValueError(f"{name} has no field {unknown[0]!r}; fields: {sorted(names)}")
    return options


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine is built from; names follow vLLM's engine arguments.

    kv_cache_memory is the KV pool's size in GiB; None picks a default for the device: 4 GiB on
    a CPU; on a GPU, gpu_memory_utilization of its memory less the weights and the activations of
    the largest step, measured. The pool is never sized from max_model_len x max_num_seqs.
    swap_space is the CPU pool (GiB) that preemption by swap moves blocks to; preemption_mode
    "auto" swaps groups of several sequences (parallel samples, beams) and recomputes single
    ones, as vLLM V0. gpu_memory_utilization is vLLM's: the share of GPU memory pagedgen uses.
    enforce_eager False (the default) replays steps from graphs as compilation_config says
    (worker/graph_capture.py); True runs every step eagerly. async_scheduling (vLLM's name)
    schedules and queues step N + 1 before the host has step N's tokens, which the device hands
    from one step to the next, so the host's work overlaps the device's (LLMEngine.step).
    enable_lora lets requests run with LoRA adapters (max_loras of them in one step, of rank up to
    max_lora_rank; at most max_cpu_loras of them kept read in host memory: vLLM's names).
    kv_cache_dtype (vLLM's) stores K/V in the model's dtype ("auto") or in 8-bit floats ("fp8",
    "fp8_e4m3", "fp8_e5m2"), which hold 2x (4x in float32) the tokens in the same memory.
    quantization (vLLM's name) "int8" or "int4" quantizes a float checkpoint's linear layers at
    load (a quantized one keeps its own integers), which then compute on the integers on a CPU;
    "none" computes a quantized checkpoint in float; None keeps a quantized checkpoint's integers
    where the model computes in float32 and dequantizes them in bfloat16 (loader.weights.
    keeps_quantized says why).
    speculative_config (vLLM's dict, {"method": "ngram", "num_speculative_tokens": k, ...})
    verifies draft tokens found by n-gram prompt lookup (spec_decode/); not with async_scheduling.
    runner (vLLM's) "generate" samples completions, "pooling" pools prompts: embeddings
    (LLM.embed) or, with a classifier checkpoint, its scores (LLM.classify), as pooler_config says
    ({"pooling_type": "LAST" | "MEAN" | "CLS", "use_activation": bool}, over the model's
    sentence-transformers files); "auto" pools with a checkpoint that has no LM head (an
    architecture named *Model, as LlamaModel) or is a classifier (*ForSequenceClassification),
    else generates.
    download_dir (vLLM's) is the Hugging Face cache a hub id is looked up in (offline), revision
    the hub snapshot of it to load; tokenizer a tokenizer folder or hub id apart from the model's.
    tensor_parallel_size and pipeline_parallel_size are vLLM's and must be 1: one engine runs on
    one device.
    """

    model: str = DEFAULT_MODEL
    trust_remote_code: bool = False  # vLLM's: run the model folder's own config/tokenizer code
    # vLLM's: config fields set over the checkpoint's ({"architectures": [...], ...}); JSON ok
    hf_overrides: dict[str, Any] | str | None = None
    download_dir: str | None = None  # vLLM's: the Hugging Face cache; None: the default one
    revision: str | None = None  # vLLM's: the hub snapshot (branch, tag or commit) in the cache
    tokenizer: str | None = None  # vLLM's: a tokenizer folder or hub id; None: the model's
    dtype: str = "auto"  # or vLLM's aliases "half" (float16), "float" (float32)
    device: str = "auto"
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # vLLM's name; QUANTIZATIONS
    kv_cache_memory: float | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    attention_backend: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "auto"
    swap_space: float = 1.0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    seed: int | None = 0  # None: a fresh random seed each engine, as vLLM's
    num_threads: int | None = None  # torch's intra-op threads; None: one a core others leave free
    enforce_eager: bool = False
    async_scheduling: bool = False
    enable_lora: bool = False
    max_loras: int = 1  # adapters one step may hold (each a slot in every adapted layer)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters kept read in host memory; None: max_loras
    # vLLM's {"method": "ngram", "num_speculative_tokens": k, ...}; a SpeculativeConfig after init
    speculative_config: SpeculativeConfig | dict[str, Any] | str | None = None
    # Where requests that set no sampling field get their defaults (vLLM's names): "auto", the
    # model's generation_config.json; "vllm", SamplingParams' own; or a folder holding one.
    # vLLM's: the model reasons in <think>...</think> first; structured output holds what comes
    # after, and chat answers are split there (io/reasoning.py)
    reasoning_parser: str | None = None
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] | str | None = None  # fields over those; JSON ok
    runner: str = "auto"
    pooler_config: dict[str, Any] | str | None = None  # JSON ok
    # The CUDA attention kernels the cupy backend takes; a dict of its fields or JSON ok
    cuda_attention_config: CudaAttentionConfig | dict[str, Any] | str | None = None
    # Which steps replay graphs (vLLM's); a dict of CompilationConfig's fields or JSON ok
    compilation_config: CompilationConfig | dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        if self.seed is None:
            self.seed = secrets.randbits(63)
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype not in DTYPES:
            names = (*DTYPES, *DTYPE_ALIASES)
            raise ValueError(f"dtype must be one of {names}, got {self.dtype!r}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) != 1:
                raise ValueError(
                    f"{name} must be 1, got {getattr(self, name)}: one pagedgen process runs on "
                    "one device; --ray (Ray Data replicas) or --shard I/N (one process per "
                    "shard) spread a batch over processes"
                )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {REASONING_PARSERS}, "
                f"got {self.reasoning_parser!r}"
            )
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(
                f"block_size must be a power of two from 1 to 128, got {self.block_size}"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 GiB, got {self.kv_cache_memory}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self.override_generation_config = (
            json_object("override_generation_config", self.override_generation_config) or {}
        )
        self.hf_overrides = json_object("hf_overrides", self.hf_overrides) or {}
        self.cuda_attention_config = CudaAttentionConfig.parse(self.cuda_attention_config)
        self.compilation_config = CompilationConfig.parse(self.compilation_config)
        if self.speculative_config is not None and self.async_scheduling:
            raise ValueError("async_scheduling does not run with speculative decoding")
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {self.runner!r}")
        self.pooler_config = json_object("pooler_config", self.pooler_config)
        resolve_pooler_config(None, self.pooler_config)  # bad keys or values fail here
        if self.runner == "pooling":
            self.check_pooling()

    def check_pooling(self) -> None:
        """What a pooling runner cannot do: it never samples, so never drafts or overlaps."""
        if self.speculative_config is not None:
            raise ValueError("the pooling runner does not run speculative decoding")
        if self.async_scheduling:
            raise ValueError("the pooling runner does not run async_scheduling")
