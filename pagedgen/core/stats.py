from dataclasses import dataclass, field

from pagedgen.core.scheduler import Scheduler
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.spec_verify import SpecDecodeStats


@dataclass(slots=True)
class EngineStats:
    """Running totals and the latest gauges, under vLLM's metric names."""

    num_steps: int = 0
    num_prompt_tokens: int = 0  # prefill tokens computed, recomputation included
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_cache_usage_perc: float = 0.0
    peak_kv_cache_usage_perc: float = 0.0
    num_preemptions_by_mode: dict[str, int] = field(default_factory=dict)
    num_blocks_swapped_in: int = 0
    num_blocks_swapped_out: int = 0
    num_prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    num_prefix_cache_hits: int = 0  # of those, tokens whose K/V were found cached
    model_time: float = 0.0
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)  # drafts verified

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_prefix_cache_hits / max(self.num_prefix_cache_queries, 1)

    def record_step(self, scheduled: SchedulerOutput, model_time: float, num_sampled: int) -> None:
        """num_sampled: the step's tokens that were kept (async scheduling drops those of
        sequences an earlier step finished; a step verifying drafts keeps several of one)."""
        self.num_steps += 1
        self.model_time += model_time
        self.num_generation_tokens += num_sampled
        self.num_prompt_tokens += scheduled.num_prefill_tokens

    def observe(self, scheduler: Scheduler) -> None:
        block_manager = scheduler.block_manager
        self.num_running = sum(len(group.unfinished_seqs) for group in scheduler.running)
        self.num_waiting = len(scheduler.waiting)
        self.num_swapped = len(scheduler.swapped)
        self.num_preemptions = sum(scheduler.num_preemptions.values())
        self.num_preemptions_by_mode = {m.value: n for m, n in scheduler.num_preemptions.items()}
        self.num_blocks_swapped_in = scheduler.num_blocks_swapped_in
        self.num_blocks_swapped_out = scheduler.num_blocks_swapped_out
        self.num_prefix_cache_queries = block_manager.num_prefix_cache_queries
        self.num_prefix_cache_hits = block_manager.num_prefix_cache_hits
        self.kv_cache_usage_perc = block_manager.usage
        self.peak_kv_cache_usage_perc = max(self.peak_kv_cache_usage_perc, block_manager.usage)
