import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(slots=True)
class ReplicaStats:
    """What one replica (host:pid) made in this run, as its records came back."""

    num_requests: int = 0
    num_failed: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    busy_s: float = 0.0  # its seconds on the batches whose records came back

    def summary(self) -> dict[str, Any]:
        busy = max(self.busy_s, 1e-9)
        return {
            "num_requests": self.num_requests,
            "num_failed": self.num_failed,
            "num_output_tokens": self.num_output_tokens,
            "busy_s": round(self.busy_s, 3),
            "requests_per_s": round(self.num_requests / busy, 3),
            "output_tokens_per_s": round(self.num_output_tokens / busy, 2),
        }


@dataclass(slots=True)
class RayMetrics:
    """Totals over the replicas, and each replica's share."""

    start: float = field(default_factory=time.perf_counter)
    end: float | None = None
    replicas: dict[str, ReplicaStats] = field(default_factory=dict)
    num_duplicates: int = 0  # records a retried batch returned twice; only the first is kept

    @property
    def elapsed(self) -> float:
        return max((self.end or time.perf_counter()) - self.start, 1e-9)

    def observe(self, replica: str, line: dict[str, Any], busy_s: float) -> None:
        stats = self.replicas.setdefault(replica, ReplicaStats())
        prompt_tokens, output_tokens = token_counts(line)
        stats.num_requests += 1
        stats.num_failed += line.get("error") is not None
        stats.num_prompt_tokens += prompt_tokens
        stats.num_output_tokens += output_tokens
        stats.busy_s += busy_s

    def total(self, name: str) -> int:
        return sum(getattr(stats, name) for stats in self.replicas.values())

    def summary(self) -> dict[str, Any]:
        elapsed = self.elapsed
        num_completed = self.total("num_requests") - self.total("num_failed")
        return {
            "elapsed_s": round(elapsed, 3),
            "requests_per_s": round(num_completed / elapsed, 3),
            "output_tokens_per_s": round(self.total("num_output_tokens") / elapsed, 2),
            "prompt_tokens_per_s": round(self.total("num_prompt_tokens") / elapsed, 2),
            "num_output_tokens": self.total("num_output_tokens"),
            "num_prompt_tokens": self.total("num_prompt_tokens"),
            "num_duplicates_dropped": self.num_duplicates,
            "replicas": {name: stats.summary() for name, stats in self.replicas.items()},
        }


class RayProgress(NamedTuple):
    num_done: int  # records in the output, those a resumed run found included
    total: int | None
    metrics: RayMetrics
    num_stop_requests: int


def token_counts(line: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of an output line, pagedgen's or an OpenAI batch response."""
    if "completion_tokens" in line:
        return line["prompt_tokens"], line["completion_tokens"]
    usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
    return usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
