"""The torch side of building an engine: device, dtype, model, tokenizer, runner, KV pool."""

import gc
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch import nn

from pagedgen.attention import AttentionBackend, get_attention_backend
from pagedgen.attention.kv_cache_dtype import is_fp8, resolve_kv_cache_dtype
from pagedgen.config import EngineConfig
from pagedgen.core.control_plane import resolve_max_model_len, resolve_max_num_batched_tokens
from pagedgen.core.kv_geometry import (
    DEFAULT_CPU_KV_CACHE_GIB,
    GIB,
    KVGeometry,
    PoolSize,
    size_kv_pool,
)
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.engine.llm_engine import LLMEngine, log_to_stderr
from pagedgen.kernels.cpu import kernel_dtypes
from pagedgen.kernels.cpu_features import cpu_compute_dtype, isa_name
from pagedgen.layers.linear import describe_cpu_compute, describe_weights
from pagedgen.loader import resolve_model
from pagedgen.loader.generation_config import generation_eos_token_ids
from pagedgen.loader.model_files import load_config, load_tokenizer
from pagedgen.loader.quantized import check_quantization
from pagedgen.loader.resolve import resolve_tokenizer
from pagedgen.loader.weights import load_model
from pagedgen.model_config import freeable_window
from pagedgen.models.classifier import classifier_tokens
from pagedgen.models.registry import get_model_class
from pagedgen.pooling.config import PoolerConfig, pick_pooler_config
from pagedgen.sampling_params import SamplingParams
from pagedgen.worker.allocator import keep_freed_memory, release_freed_memory
from pagedgen.worker.cpu_threads import fit_num_threads
from pagedgen.worker.graph_capture import capture_graphs
from pagedgen.worker.lora_manager import LoRAManager
from pagedgen.worker.model_runner import ModelRunner
from pagedgen.worker.pooler import Pooler


class ModelSetup(NamedTuple):
    runner: ModelRunner
    tokenizer: Any
    hf_config: Any
    max_model_len: int
    num_blocks: int
    num_cpu_blocks: int
    eos_token_ids: set[int]
    pooler_config: PoolerConfig | None  # a pooling runner's


def build_engine(
    config: EngineConfig,
    log: Callable[[str], None] = log_to_stderr,
    status: Callable[[str], None] = lambda phase: None,
) -> LLMEngine:
    """The engine over the model config names, loaded, its KV cache sized; logs what it built
    and tells status each phase as it starts (a progress line's text)."""
    model = setup_model(config, log, status)
    if model.pooler_config is not None and model.pooler_config.reads_every_prompt_token:
        config = replace(config, enable_prefix_caching=False)  # a hit skips rows it pools
    engine = LLMEngine(
        config,
        model.runner,
        model.tokenizer,
        model.num_blocks,
        model.num_cpu_blocks,
        model.max_model_len,
        model.eos_token_ids,
        sliding_window=freeable_window(model.hf_config),
        vocab_size=getattr(model.hf_config, "vocab_size", None),
        pooler_config=model.pooler_config,
    )
    engine.hf_config = model.hf_config
    # As vLLM's engine core does: what loading made lives as long as the engine, so the
    # collector stops walking it (its full collections during a run walked every module,
    # tensor and tokenizer object again).
    gc.collect()
    gc.freeze()
    return engine


class LoadedModel(NamedTuple):
    """What the checkpoint gives: the model on its device, with what it was read with."""

    model: nn.Module
    hf_config: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype  # the weights' values and the KV cache
    compute_dtype: torch.dtype
    backend: AttentionBackend
    geometry: KVGeometry
    kv_cache_dtype: torch.dtype
    max_model_len: int
    pooler_config: PoolerConfig | None
    eos_token_ids: set[int]


class GraphModes(NamedTuple):
    cuda: bool  # decode steps replay CUDA graphs
    cpu: bool  # decode steps replay recorded CPU graphs


def setup_model(
    config: EngineConfig,
    log: Callable[[str], None],
    status: Callable[[str], None] = lambda phase: None,
) -> ModelSetup:
    """Loads the model, builds its runner and sizes its KV pool; logs what it built."""
    status("loading the model")
    device, threads_note = pick_device(config.device), None
    if device.type == "cpu":
        _, threads_note = fit_num_threads(config.num_threads)
    elif config.num_threads is not None:  # torch's thread count is process-wide
        torch.set_num_threads(config.num_threads)
    loaded = load(config, device)
    status("allocating the KV cache")
    runner = build_runner(config, loaded)
    kv_cache_bytes = kv_cache_budget(config, runner, loaded.max_model_len)
    pool = size_kv_pool(loaded.geometry, config.block_size, kv_cache_bytes, config.swap_space * GIB)
    graphs = graph_modes(config, loaded, log)
    runner.allocate_kv_cache(
        pool.num_blocks, pool.num_cpu_blocks, pad_block=graphs.cuda or graphs.cpu
    )
    log(describe_model(config, loaded))
    log(describe_pool(pool, loaded.geometry, config.block_size, kv_cache_bytes))
    if threads_note is not None:
        log(threads_note)
    if loaded.pooler_config is not None:
        pooler_config = loaded.pooler_config
        log(
            f"runner pooling, task {pooler_config.task}: {pooler_config.pooling_type} pooling, "
            f"use_activation={pooler_config.use_activation}"
        )
    if graphs.cuda or graphs.cpu:
        max_num_tokens = resolve_max_num_batched_tokens(config, loaded.max_model_len)
        status(f"capturing {'CUDA' if graphs.cuda else 'CPU'} graphs")
        capture_graphs(runner, config.max_num_seqs, max_num_tokens, log, config.compilation_config)
    elif not loaded.model.supports_graphs and not eager(config, loaded):
        log(f"decode steps run eagerly: {type(loaded.model).__name__} routes tokens on the host")
    return ModelSetup(
        runner,
        loaded.tokenizer,
        loaded.hf_config,
        loaded.max_model_len,
        pool.num_blocks,
        pool.num_cpu_blocks,
        loaded.eos_token_ids,
        loaded.pooler_config,
    )


def load(config: EngineConfig, device: torch.device) -> LoadedModel:
    """The dtype, then the checkpoint: its config checked before the slow loads (an
    unsupported architecture or quantization fails first), the tokenizer, the model."""
    if device.type == "cpu":
        keep_freed_memory()
    dtype = pick_dtype(config.dtype, device)
    compute_dtype = cpu_compute_dtype(dtype) if device.type == "cpu" else dtype
    resolved = resolve_model(config.model, config.download_dir, config.revision)
    hf_config = load_config(resolved, config.trust_remote_code, config.hf_overrides)
    get_model_class(hf_config)
    check_quantization(hf_config)
    architectures = getattr(hf_config, "architectures", None) or []
    pooler_config = pick_pooler_config(
        config.runner, config.pooler_config, resolved.path, architectures
    )
    if pooler_config is not None:
        config.check_pooling()
        if getattr(hf_config, "is_causal", True) is False:  # gte-Qwen2's bidirectional encoder
            raise ValueError("the model attends bidirectionally (is_causal false): not supported")
    tokenizer = load_tokenizer(
        resolve_tokenizer(config.tokenizer, resolved, config.download_dir),
        config.trust_remote_code,
    )
    if pooler_config is not None and pooler_config.task == "classify":
        classifier_tokens(hf_config, tokenizer)
    max_model_len = resolve_max_model_len(hf_config, config.max_model_len)
    kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, dtype)
    geometry = KVGeometry.of(hf_config, kv_cache_dtype)
    backend = get_attention_backend(
        config.attention_backend,
        device,
        geometry.head_dim,
        config.block_size,
        config.cuda_attention_config,
    )
    model = load_model(
        resolved,
        hf_config,
        backend,
        max_model_len,
        dtype,
        device,
        compute_dtype,
        config.quantization,
        # the freed pages of each layer's dense and read copies, handed back as it packs
        release_freed_memory if device.type == "cpu" else None,
    )
    if device.type == "cpu":
        release_freed_memory()
    eos = eos_token_ids(hf_config, tokenizer) | generation_eos_token_ids(
        resolved.path, config.generation_config, config.override_generation_config
    )
    return LoadedModel(
        model,
        hf_config,
        tokenizer,
        device,
        dtype,
        compute_dtype,
        backend,
        geometry,
        kv_cache_dtype,
        max_model_len,
        pooler_config,
        eos,
    )


def build_runner(config: EngineConfig, loaded: LoadedModel) -> ModelRunner:
    """The runner over the model, with its pooler (a pooling runner) or LoRA slots."""
    model = loaded.model
    runner = ModelRunner(
        model,
        loaded.backend,
        loaded.geometry,
        config.block_size,
        loaded.device,
        loaded.kv_cache_dtype,
        config.seed,
        max_model_len=loaded.max_model_len,
        max_num_seqs=config.max_num_seqs,
    )
    if loaded.pooler_config is not None:
        runner.pooler = Pooler.for_model(loaded.pooler_config, model, loaded.hf_config)
        model.lm_head = None  # a pooling runner computes no logits: its memory goes back
    if config.enable_lora:
        max_num_tokens = resolve_max_num_batched_tokens(config, loaded.max_model_len)
        runner.lora = LoRAManager(
            model,
            config.max_loras,
            config.max_lora_rank,
            max_num_tokens,
            loaded.compute_dtype,
            loaded.device,
            config.max_cpu_loras,
        )
    return runner


def kv_cache_budget(config: EngineConfig, runner: ModelRunner, max_model_len: int) -> float:
    """The KV pool's bytes: kv_cache_memory if given, else what a GPU has left (measured), else
    the CPU default."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory * GIB
    if runner.device.type == "cuda":
        return gpu_kv_cache_bytes(runner, config, max_model_len)
    return DEFAULT_CPU_KV_CACHE_GIB * GIB


def eager(config: EngineConfig, loaded: LoadedModel) -> bool:
    """Every step runs eagerly: asked for, or a pooling runner (its steps are prompts: it never
    decodes)."""
    return config.enforce_eager or loaded.pooler_config is not None


def graph_modes(
    config: EngineConfig, loaded: LoadedModel, log: Callable[[str], None]
) -> GraphModes:
    """Whether decode steps replay CUDA graphs or recorded CPU graphs."""
    device, backend = loaded.device, loaded.backend
    replays = not eager(config, loaded) and loaded.model.supports_graphs
    cuda = device.type == "cuda" and replays
    if cuda and backend.name != "cupy":
        # A graph fixes max_context_len at max_model_len: torch's decode would then gather
        # every row's whole table, where the cupy kernel reads each row's own context only.
        log("decode CUDA graphs need the cupy decode kernels; running eagerly")
        cuda = False
    cpu = (
        device.type == "cpu"
        and backend.name == "cpu"
        and replays
        and loaded.dtype in kernel_dtypes()
        and loaded.kv_cache_dtype in kernel_dtypes()
    )
    return GraphModes(cuda, cpu)


def describe_model(config: EngineConfig, loaded: LoadedModel) -> str:
    """The startup line: the model, its dtype, where and how it computes, its attention."""
    device, dtype, kv_cache_dtype = loaded.device, loaded.dtype, loaded.kv_cache_dtype
    where = str(device)
    if device.type == "cpu":
        threads = torch.get_num_threads()
        where = f"cpu {isa_name()} x {threads} thread{'s' if threads > 1 else ''}, "
        where += describe_cpu_compute(dtype)
    attention = f"{loaded.backend.name} attention"
    if kv_cache_dtype != dtype:
        attention += f", {config.kv_cache_dtype} KV cache"
    scaled = [
        layer.use_kv_scales(is_fp8(kv_cache_dtype)) for layer in loaded.model.attention_layers
    ]
    if any(scaled):
        attention += f" scaled by the checkpoint's k_scale and v_scale in {sum(scaled)} layers"
    return (
        f"model {config.model} ({type(loaded.model).__name__}, {dtype}, {where}, "
        f"{describe_weights(loaded.model)}, {attention}), max_model_len {loaded.max_model_len}"
    )


def describe_pool(
    pool: PoolSize, geometry: KVGeometry, block_size: int, asked_bytes: float | None = None
) -> str:
    """The pool as built, in whole blocks, and the budget it was cut from (as given: 0.005 GiB
    prints as 0.005, not rounded to 0.01)."""
    num_tokens = pool.num_blocks * block_size
    gib = num_tokens * geometry.bytes_per_token / GIB
    asked = "" if asked_bytes is None else f" of {asked_bytes / GIB:.6g} GiB asked"
    return (
        f"KV cache: {pool.num_blocks} blocks x {block_size} tokens = {num_tokens} tokens, "
        f"{gib:.3g} GiB{asked} ({geometry.bytes_per_token} bytes/token of {geometry.dtype}); "
        f"CPU swap pool {pool.num_cpu_blocks} blocks"
    )


def gpu_kv_cache_bytes(runner: ModelRunner, config: EngineConfig, max_model_len: int) -> float:
    """What the pool may take on a GPU: gpu_memory_utilization of its memory, less what is in use
    (weights, CUDA context) and the activations' peak, measured by a warm-up step of
    max_num_batched_tokens prompt tokens (nano-vllm's warmup_model / allocate_kv_cache)."""
    device = runner.device
    num_tokens = resolve_max_num_batched_tokens(config, max_model_len)
    seq_lens = [
        min(max_model_len, num_tokens - done) for done in range(0, num_tokens, max_model_len)
    ]
    runner.allocate_kv_cache(sum(-(-n // runner.block_size) for n in seq_lens), 0)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    warm_up(runner, seq_lens)
    torch.cuda.synchronize(device)
    activations = torch.cuda.max_memory_allocated(device) - base
    runner.allocate_kv_cache(0, 0)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    kv_cache_bytes = total * config.gpu_memory_utilization - (total - free) - activations
    if kv_cache_bytes <= 0:
        raise ValueError(
            f"no GPU memory left for the KV cache: {total / GIB:.1f} GiB x "
            f"gpu_memory_utilization {config.gpu_memory_utilization} is less than the "
            f"{(total - free) / GIB:.1f} GiB in use plus {activations / GIB:.2f} GiB of "
            "activations; lower max_num_batched_tokens or raise gpu_memory_utilization"
        )
    return kv_cache_bytes


def warm_up(runner: ModelRunner, seq_lens: list[int]) -> None:
    """One prefill step of sequences of these lengths through the runner's current pool, each
    sampling one token: the largest step the engine will run."""
    seqs, block_id = [], 0
    for i, n in enumerate(seq_lens):
        seq = Sequence(i, "warm-up", [0] * n, SamplingParams(temperature=0, max_tokens=1))
        num_blocks = -(-n // runner.block_size)
        seq.block_table = list(range(block_id, block_id + num_blocks))
        block_id += num_blocks
        seqs.append(seq)
    rows = list(range(len(seqs)))
    runner.execute(
        SchedulerOutput(seqs, [0] * len(seqs), seq_lens, 0, seqs, rows, [], [], [], [], {})
    )


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def eos_token_ids(hf_config: Any, tokenizer: Any) -> set[int]:
    ids = getattr(hf_config, "eos_token_id", None)
    ids = set(ids) if isinstance(ids, list) else ({ids} if ids is not None else set())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
