from dataclasses import dataclass, field

from pagedgen.cpu_load import cpu_shares, sample_cpu


@dataclass(slots=True)
class RunResult:
    """One engine's timed pass over a workload; figures as vLLM's `bench throughput` prints them.

    Token counts are useful tokens only: each request's prompt and its own max_tokens outputs,
    never the padding or the extra tokens a static batch computes for its longest request.
    """

    name: str
    elapsed: float
    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    output_token_ids: list[list[int]] = field(repr=False)
    num_steps: int | None = None  # model forward passes, where the engine tells
    cpu: dict[str, float] = field(default_factory=dict)
    note: str = ""  # why the figures cover less than the workload (a baseline stopped early)
    engine: str = ""  # the engine's name and version, where it differs from the run's name

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed

    @property
    def total_tokens_per_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.elapsed

    def figures(self) -> dict:
        return {
            "elapsed_s": round(self.elapsed, 3),
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "requests_per_s": self.requests_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "num_steps": self.num_steps,
            **self.cpu,
            "note": self.note,
            "engine": self.engine,
        }


class Timer:
    """Wall time and machine CPU shares around a timed region: `with Timer() as t: ...`."""

    def __enter__(self) -> "Timer":
        self.start = sample_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = sample_cpu()
        self.elapsed = self.end.wall - self.start.wall
        self.cpu = cpu_shares(self.start, self.end)


def ratios(ours: RunResult, baseline: RunResult) -> dict[str, float]:
    return {
        "requests_per_s": ours.requests_per_s / baseline.requests_per_s,
        "total_tokens_per_s": ours.total_tokens_per_s / baseline.total_tokens_per_s,
        "output_tokens_per_s": ours.output_tokens_per_s / baseline.output_tokens_per_s,
    }


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, int]:
    """How many requests produced identical token ids, and how many tokens matched before the
    first difference (summed over requests)."""
    identical = sum(a == b for a, b in zip(ours, theirs))
    matched = 0
    for a, b in zip(ours, theirs):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        matched += n
    return {
        "num_identical_requests": identical,
        "num_requests": len(ours),
        "num_matching_prefix_tokens": matched,
        "num_tokens": sum(len(a) for a in ours),
    }
