"""Drives the real Scheduler and BlockManager with token counts only, no model.

Each step does what LLMEngine.step does around the model: the scheduled tokens count as
computed, every sequence whose prompt is then complete samples one token, and a sequence
finishes when it reaches its target output length. Admission, chunked prefill, prefix caching,
preemption and block allocation are the engine's own code, so the pool behaves as in a real run
of the same lengths. Prompts keep their real token ids (prefix-cache hits are real); every
sampled token is unique to its sequence, so generated text is never mistaken for shared.
"""

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from pagedgen.config import EngineConfig
from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.control_plane import build_control_plane
from pagedgen.engine.scheduler import Scheduler
from pagedgen.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedgen.profile.kv_usage import KVUsageTracker
from pagedgen.sampling_params import SamplingParams


class SimRequest(NamedTuple):
    prompt_token_ids: list[int]
    num_output_tokens: int  # the length every sample of the request stops at
    max_tokens: int | None  # what admission checks, and what contiguous allocation reserves
    n: int = 1
    sampling_params: SamplingParams | None = None  # the record's own, for a real run


class PoolShape(NamedTuple):
    num_blocks: int
    num_cpu_blocks: int
    max_model_len: int


class SimResult(NamedTuple):
    tracker: KVUsageTracker
    num_finished: int  # requests
    num_rejected: int  # requests Scheduler.add refused (too long for the model or the pool)
    num_preemptions: int
    prefix_cache_hit_rate: float
    elapsed: float


def simulate(
    requests: Iterable[SimRequest],
    config: EngineConfig,
    shape: PoolShape,
    keep_timeline: bool = False,
    on_step: Callable[[BlockManager, Scheduler], None] | None = None,
) -> SimResult:
    start = time.perf_counter()
    block_manager, scheduler = build_control_plane(
        config, shape.num_blocks, shape.num_cpu_blocks, shape.max_model_len
    )
    tracker = KVUsageTracker(block_manager, shape.max_model_len, keep_timeline)
    targets: dict[str, int] = {}  # request id -> output length
    groups: dict[str, SequenceGroup] = {}
    pending = iter(requests)
    max_pending = 2 * config.max_num_seqs  # as LLM.stream admits
    exhausted = False
    num_added = num_finished = num_rejected = 0
    while True:
        while not exhausted and scheduler.num_unfinished < max_pending:
            request = next(pending, None)
            if request is None:
                exhausted = True
                break
            request_id = str(num_added)
            num_added += 1
            params = SamplingParams(n=request.n, max_tokens=request.max_tokens, ignore_eos=True)
            seq = Sequence(request_id, request.prompt_token_ids, params)
            group = SequenceGroup(request_id, seq, params)
            if scheduler.add(group) is not None:
                num_rejected += 1
                continue
            groups[request_id] = group
            room = shape.max_model_len - len(request.prompt_token_ids)
            targets[request_id] = max(1, min(request.num_output_tokens, request.max_tokens or room))
        if not scheduler.has_unfinished():
            break
        scheduled = scheduler.schedule()
        if scheduled.is_empty:
            raise RuntimeError("the scheduler can make no progress; the KV pool is too small")
        for seq, num_new_tokens in zip(scheduled.seqs, scheduled.num_new_tokens):
            seq.num_computed_tokens += num_new_tokens
        finished_any = False
        for seq in scheduled.seqs:
            if seq.num_computed_tokens != seq.num_tokens:
                continue
            seq.append_token_id(-1 - seq.seq_id)
            if seq.num_output_tokens >= targets[seq.request_id]:
                seq.finish(SequenceStatus.FINISHED_LENGTH_CAPPED)
                scheduler.finish(seq)
                finished_any = True
                if groups[seq.request_id].is_finished:
                    del targets[seq.request_id], groups[seq.request_id]
                    num_finished += 1
        if finished_any:
            scheduler.remove_finished_groups()
        tracker.observe()
        if on_step is not None:
            on_step(block_manager, scheduler)
    return SimResult(
        tracker,
        num_finished,
        num_rejected,
        sum(scheduler.num_preemptions.values()),
        block_manager.num_prefix_cache_hits / max(block_manager.num_prefix_cache_queries, 1),
        time.perf_counter() - start,
    )
