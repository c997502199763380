"""Runs the real engine loop on token counts only: LLMEngine with a NullRunner, no model.

The null runner samples, for every sequence the scheduler says samples, a token unique to that
sequence (so generated text is never mistaken for shared), and eos once the sequence reaches its
request's output length. Admission, chunked prefill, prefix caching, preemption, block
allocation, stopping and freeing are the engine's own code, so the pool behaves as in a real run
of the same lengths. Prompts keep their real token ids (prefix-cache hits are real).
"""

import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from pagedgen.config import EngineConfig
from pagedgen.core.runner import NullRunner
from pagedgen.core.sequence import Sequence
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.entrypoints.profile.kv_usage import KVUsageTracker
from pagedgen.sampling_params import SamplingParams

EOS = -1  # the null runner's vocabulary: eos, and -2 - seq_id for each sequence's tokens


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
    on_step: Callable[[LLMEngine], None] | None = None,
) -> SimResult:
    start = time.perf_counter()
    num_output_tokens: dict[str, int] = {}

    def next_token(seq: Sequence) -> int:
        done = seq.num_output_tokens + 1 >= num_output_tokens[seq.request_id]
        return EOS if done else -2 - seq.seq_id

    engine = LLMEngine(
        config,
        NullRunner(next_token),
        tokenizer=None,
        num_blocks=shape.num_blocks,
        num_cpu_blocks=shape.num_cpu_blocks,
        max_model_len=shape.max_model_len,
        eos_token_ids={EOS},
    )
    tracker = KVUsageTracker(engine.block_manager, shape.max_model_len, keep_timeline)

    def engine_requests() -> Iterator[tuple[str, list[int], SamplingParams]]:
        for i, request in enumerate(requests):
            num_output_tokens[str(i)] = request.num_output_tokens
            params = SamplingParams(n=request.n, max_tokens=request.max_tokens, detokenize=False)
            yield str(i), request.prompt_token_ids, params

    def observe(engine: LLMEngine) -> None:
        tracker.observe()
        if on_step is not None:
            on_step(engine)

    num_finished = num_rejected = 0
    for output in engine.stream(engine_requests(), on_step=observe):
        num_rejected += output.error is not None
        num_finished += output.error is None
    stats = engine.stats
    return SimResult(
        tracker,
        num_finished,
        num_rejected,
        stats.num_preemptions,
        stats.prefix_cache_hit_rate,
        time.perf_counter() - start,
    )
