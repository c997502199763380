from typing import Any

from pagedgen.config import EngineConfig
from pagedgen.core.block_manager import BlockManager
from pagedgen.core.preemption import PreemptionMode
from pagedgen.core.scheduler import Scheduler

DEFAULT_MAX_NUM_BATCHED_TOKENS = 4096
DEFAULT_MAX_MODEL_LEN = 2048


# Where configs give their context length (vLLM's list): OPT and most, GPT-2, MPT, ChatGLM2,
# Command-R, and others; where several are set, the smallest holds.
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def resolve_max_model_len(hf_config: Any, requested: int | None) -> int:
    """The config's context length (2048 where it names none: BLOOM's ALiBi has no limit), or
    a smaller one asked for."""
    lengths = [getattr(hf_config, key, None) for key in MAX_LEN_KEYS]
    limit = min([n for n in lengths if isinstance(n, int) and n > 0], default=DEFAULT_MAX_MODEL_LEN)
    if requested is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's limit of {limit}")
    return requested or limit


def resolve_max_num_batched_tokens(config: EngineConfig, max_model_len: int) -> int:
    """The most tokens one step computes: as asked, else 4096 (without chunked prefill, at
    least max_model_len, so any prompt fits one step); never below max_num_seqs."""
    max_batched = config.max_num_batched_tokens or (
        DEFAULT_MAX_NUM_BATCHED_TOKENS
        if config.enable_chunked_prefill
        else max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    )
    return max(max_batched, config.max_num_seqs)


def build_control_plane(
    config: EngineConfig,
    num_blocks: int,
    num_cpu_blocks: int,
    max_model_len: int,
    sliding_window: int | None = None,
) -> tuple[BlockManager, Scheduler]:
    """The block manager and scheduler of an engine; sliding_window: see freeable_window."""
    block_manager = BlockManager(
        num_blocks,
        config.block_size,
        num_cpu_blocks,
        config.enable_prefix_caching,
        sliding_window=sliding_window,
    )
    mode = None if config.preemption_mode == "auto" else PreemptionMode(config.preemption_mode)
    scheduler = Scheduler(
        block_manager,
        config.max_num_seqs,
        resolve_max_num_batched_tokens(config, max_model_len),
        max_model_len,
        config.enable_chunked_prefill,
        mode,
        max_loras=config.max_loras if config.enable_lora else None,
    )
    return block_manager, scheduler
