import time
from dataclasses import dataclass, field
from typing import Any

from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.outputs import RequestOutput


@dataclass(slots=True)
class RunMetrics:
    """What a batch run measures besides the engine's own counters: per-request latencies and
    the KV-cache usage of every step (for its mean)."""

    start: float = field(default_factory=time.perf_counter)
    end: float | None = None
    num_completed: int = 0  # requests that ran and finished in this run
    num_output_tokens: int = 0
    max_num_output_tokens: int = 0  # of one request
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    num_steps: int = 0
    kv_cache_usage_sum: float = 0.0

    @property
    def elapsed(self) -> float:
        return max((self.end or time.perf_counter()) - self.start, 1e-9)

    def observe_step(self, engine: LLMEngine) -> None:
        self.num_steps += 1
        self.kv_cache_usage_sum += engine.stats.kv_cache_usage_perc

    def observe_output(self, output: RequestOutput) -> None:
        if output.error is not None:
            return
        self.num_completed += 1
        self.num_output_tokens += output.num_output_tokens
        self.max_num_output_tokens = max(self.max_num_output_tokens, output.num_output_tokens)
        if output.metrics.latency is not None:
            self.latencies.append(output.metrics.latency)
        if output.metrics.time_to_first_token is not None:
            self.ttfts.append(output.metrics.time_to_first_token)

    def summary(self, engine: LLMEngine) -> dict[str, Any]:
        stats, elapsed = engine.stats, self.elapsed
        summary = {
            "elapsed_s": round(elapsed, 3),
            "requests_per_s": round(self.num_completed / elapsed, 3),
            "output_tokens_per_s": round(self.num_output_tokens / elapsed, 2),
            "prompt_tokens_per_s": round(stats.num_prompt_tokens / elapsed, 2),
            "mean_latency_s": _round(_mean(self.latencies)),
            "p90_latency_s": _round(percentile(self.latencies, 90)),
            "mean_time_to_first_token_s": _round(_mean(self.ttfts)),
            "peak_kv_cache_usage_perc": round(stats.peak_kv_cache_usage_perc, 4),
            "mean_kv_cache_usage_perc": round(self.kv_cache_usage_sum / max(self.num_steps, 1), 4),
            "num_preemptions": stats.num_preemptions,
            "prefix_cache_hit_rate": round(stats.prefix_cache_hit_rate, 4),
            "num_steps": self.num_steps,
            "num_output_tokens": self.num_output_tokens,
            "num_prompt_tokens": stats.num_prompt_tokens,
        }
        if engine.pooler_config is not None:  # a pooling job: it generates no tokens
            summary["runner"] = "pooling"
        return {**summary, **structured_output_summary(engine), **spec_decode_summary(engine)}


def spec_decode_summary(engine: LLMEngine) -> dict[str, Any]:
    """Draft tokens proposed and accepted, under vLLM's names, when speculative decoding ran."""
    if engine.config.speculative_config is None:
        return {}
    return {"spec_decode": engine.stats.spec_decode.summary()}


def structured_output_summary(engine: LLMEngine) -> dict[str, Any]:
    """Grammar compile and mask times, when some request asked for structured output."""
    stats = engine.structured_output.stats
    used = stats.num_grammars_compiled or stats.num_compile_cache_hits
    return {"structured_output": stats.summary()} if used else {}


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
