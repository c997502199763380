from pagedgen.config import EngineConfig
from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.scheduler import PreemptionMode, Scheduler

DEFAULT_MAX_NUM_BATCHED_TOKENS = 4096
DEFAULT_MAX_MODEL_LEN = 2048


def resolve_max_model_len(hf_config, requested: int | None) -> int:
    """The config's context length, or a smaller one asked for."""
    limit = getattr(hf_config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    if requested is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's limit of {limit}")
    return requested or limit


def build_control_plane(
    config: EngineConfig, num_blocks: int, num_cpu_blocks: int, max_model_len: int
) -> tuple[BlockManager, Scheduler]:
    """The block manager and scheduler of an engine; shared with `pagedgen profile --simulate`,
    which drives them without a model."""
    block_manager = BlockManager(
        num_blocks, config.block_size, num_cpu_blocks, config.enable_prefix_caching
    )
    max_batched = config.max_num_batched_tokens or (
        DEFAULT_MAX_NUM_BATCHED_TOKENS
        if config.enable_chunked_prefill
        else max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    )
    mode = None if config.preemption_mode == "auto" else PreemptionMode(config.preemption_mode)
    scheduler = Scheduler(
        block_manager,
        config.max_num_seqs,
        max(max_batched, config.max_num_seqs),
        max_model_len,
        config.enable_chunked_prefill,
        mode,
    )
    return block_manager, scheduler
