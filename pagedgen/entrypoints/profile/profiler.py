"""How well the paged KV cache is used for an input and a model: a real run or a simulation,
the contiguous baselines beside it, and a table over block sizes at the same memory."""

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pagedgen.config import EngineConfig
from pagedgen.core.kv_geometry import GIB, KVGeometry, size_kv_pool
from pagedgen.entrypoints.batch.metrics import structured_output_summary
from pagedgen.entrypoints.batch.requests import RequestBuilder, RequestError
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.llm import LLM
from pagedgen.entrypoints.profile.kv_usage import KVUsageTracker
from pagedgen.entrypoints.profile.simulate import PoolShape, SimRequest, SimResult, simulate

BLOCK_SIZES = (8, 16, 32, 64, 128)


@dataclass(slots=True)
class ProfileReport:
    mode: str  # "real" or "simulate"
    model: str
    geometry: KVGeometry
    block_size: int
    num_blocks: int
    max_model_len: int
    workload: dict[str, Any]
    run: dict[str, Any]
    block_sizes: list[dict[str, Any]]
    timeline: list[tuple[int, int, int]] = field(default_factory=list)  # (used, held, live)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def to_dict(self) -> dict[str, Any]:
        geometry = self.geometry
        return {
            "mode": self.mode,
            "model": self.model,
            "kv_cache": {
                "bytes_per_token": geometry.bytes_per_token,
                "formula": geometry.formula,
                **geometry._asdict(),
                "block_size": self.block_size,
                "num_blocks": self.num_blocks,
                "num_tokens": self.pool_tokens,
                "memory_gib": round(self.pool_tokens * geometry.bytes_per_token / GIB, 3),
                "max_model_len": self.max_model_len,
            },
            "workload": self.workload,
            "run": self.run,
            "block_sizes": self.block_sizes,
        }


def build_workload(
    records: Iterable[InputRecord], builder: RequestBuilder, max_model_len: int
) -> tuple[list[SimRequest], dict[str, Any]]:
    """Token lengths of every runnable record: the prompt's, and the output's from the record's
    reference completion (text or a token count) when it has one, else from max_tokens."""
    requests: list[SimRequest] = []
    num_invalid = num_with_reference = 0
    for record in records:
        try:
            prompt, params = builder.prepare(record)
        except RequestError:
            num_invalid += 1
            continue
        output_len = _reference_length(record.reference, builder.tokenizer)
        num_with_reference += output_len is not None
        if output_len is None:
            output_len = params.max_tokens or max(1, max_model_len - len(prompt))
        requests.append(SimRequest(list(prompt), output_len, params.max_tokens, params.n, params))
    return requests, _describe(requests, num_invalid, num_with_reference)


def profile_simulated(
    config: EngineConfig,
    geometry: KVGeometry,
    kv_bytes: float,
    max_model_len: int,
    requests: list[SimRequest],
    workload: dict[str, Any],
    block_sizes: Iterable[int] = BLOCK_SIZES,
) -> ProfileReport:
    main = _simulate_at(config, geometry, kv_bytes, max_model_len, requests, keep_timeline=True)
    run = {**main.tracker.summary(), **_counts(main)}
    block_sizes = list(block_sizes)
    others = [size for size in block_sizes if size != config.block_size]
    table = _block_size_table(config, geometry, kv_bytes, max_model_len, requests, others)
    if config.block_size in block_sizes:
        table.append(_table_row(config.block_size, main))
        table.sort(key=lambda row: row["block_size"])
    return ProfileReport(
        "simulate",
        config.model,
        geometry,
        config.block_size,
        main.tracker.block_manager.num_blocks,
        max_model_len,
        workload,
        run,
        table,
        main.tracker.timeline,
    )


def profile_real(
    llm: LLM,
    requests: list[SimRequest],
    workload: dict[str, Any],
    block_sizes: Iterable[int] = BLOCK_SIZES,
) -> ProfileReport:
    """Runs the requests through the engine, sampling its block manager after every step. The
    block-size table then simulates the lengths the run actually produced."""
    engine = llm.engine
    geometry = engine.runner.geometry
    tracker = KVUsageTracker(engine.block_manager, engine.max_model_len, keep_timeline=True)
    produced: dict[int, int] = {}
    num_errors = 0
    start = time.perf_counter()
    stream = ((str(i), r.prompt_token_ids, r.sampling_params) for i, r in enumerate(requests))
    for output in llm.stream(stream, on_step=lambda _: tracker.observe()):
        if output.error is not None:
            num_errors += 1
            continue
        lengths = [len(c.token_ids) for c in output.outputs]
        produced[int(output.request_id)] = max(1, round(sum(lengths) / len(lengths)))
    elapsed = time.perf_counter() - start
    stats = engine.stats
    run = {
        **tracker.summary(),
        "num_finished": len(produced),
        "num_rejected": num_errors,
        "num_preemptions": stats.num_preemptions,
        "prefix_cache_hit_rate": round(stats.prefix_cache_hit_rate, 4),
        "elapsed_s": round(elapsed, 3),
        **structured_output_summary(engine),
    }
    actual = [
        r._replace(num_output_tokens=produced[i]) for i, r in enumerate(requests) if i in produced
    ]
    workload = {**workload, "mean_output_tokens": _mean(r.num_output_tokens for r in actual)}
    kv_bytes = engine.num_blocks * engine.config.block_size * geometry.bytes_per_token
    table = _block_size_table(
        engine.config, geometry, kv_bytes, engine.max_model_len, actual, block_sizes
    )
    return ProfileReport(
        "real",
        engine.config.model,
        geometry,
        engine.config.block_size,
        engine.num_blocks,
        engine.max_model_len,
        workload,
        run,
        table,
        tracker.timeline,
    )


def _simulate_at(
    config: EngineConfig,
    geometry: KVGeometry,
    kv_bytes: float,
    max_model_len: int,
    requests: list[SimRequest],
    keep_timeline: bool = False,
) -> SimResult:
    pool = size_kv_pool(geometry, config.block_size, kv_bytes, config.swap_space * GIB)
    shape = PoolShape(pool.num_blocks, pool.num_cpu_blocks, max_model_len)
    return simulate(requests, config, shape, keep_timeline)


def _block_size_table(
    config: EngineConfig,
    geometry: KVGeometry,
    kv_bytes: float,
    max_model_len: int,
    requests: list[SimRequest],
    block_sizes: Iterable[int],
) -> list[dict[str, Any]]:
    rows = []
    for block_size in block_sizes:
        sized = replace(config, block_size=block_size)
        result = _simulate_at(sized, geometry, kv_bytes, max_model_len, requests)
        rows.append(_table_row(block_size, result))
    return rows


def _table_row(block_size: int, result: SimResult) -> dict[str, Any]:
    summary = result.tracker.summary()
    return {
        "block_size": block_size,
        "num_blocks": result.tracker.block_manager.num_blocks,
        **{k: summary[k] for k in _TABLE_KEYS},
        **_counts(result),
    }


_TABLE_KEYS = (
    "live_token_utilization",
    "internal_fragmentation",
    "mean_pool_usage",
    "peak_pool_usage",
    "prefix_sharing_savings",
    "mean_running",
    "num_steps",
)


def _counts(result: SimResult) -> dict[str, Any]:
    return {
        "num_finished": result.num_finished,
        "num_rejected": result.num_rejected,
        "num_preemptions": result.num_preemptions,
        "prefix_cache_hit_rate": round(result.prefix_cache_hit_rate, 4),
        "elapsed_s": round(result.elapsed, 3),
    }


def _reference_length(reference: Any, tokenizer: Any) -> int | None:
    if isinstance(reference, int) and not isinstance(reference, bool) and reference > 0:
        return reference
    if isinstance(reference, str) and reference:
        return max(1, len(tokenizer.encode(reference, add_special_tokens=False)))
    return None


def _describe(requests: list[SimRequest], num_invalid: int, num_with_reference: int) -> dict:
    return {
        "num_requests": len(requests),
        "num_invalid": num_invalid,
        "num_with_reference": num_with_reference,
        "mean_prompt_tokens": _mean(len(r.prompt_token_ids) for r in requests),
        "mean_output_tokens": _mean(r.num_output_tokens for r in requests),
    }


def _mean(values: Iterable[int]) -> float:
    values = list(values)
    return round(sum(values) / len(values), 1) if values else 0.0
