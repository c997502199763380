from collections import deque

from pagedgen.entrypoints.batch.job import JobProgress

WINDOW_S = 30.0
PRIOR_REQUESTS = 4  # how many finished requests the max_tokens bound weighs as


class EtaEstimator:
    """Seconds left in a run, the longer of two paces over a sliding window of recent progress:

    - throughput: the output tokens still to make over the recent output tokens/s. While
      requests wait, the batch is full and this is the pace. The tokens still to make are
      unknown until requests end: every request left takes the mean length of those finished
      (less what the running ones made), drawn towards max_tokens while few have finished,
      since the first to finish are the short ones;
    - the tail: once the batch drains, the run lasts as long as its longest request, one token a
      step: steps left for the running requests (to the longest length finished, or to
      max_tokens once the running ones outlive every finished one), times the recent step time.

    Under continuous batching requests finish in bursts while tokens and steps flow steadily,
    so this converges where requests/s since the start swings. A pooling job (embeddings,
    classification) makes no output tokens: its pace is its recent requests/s.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, output tokens, steps)

    def update(self, now: float, progress: JobProgress) -> float | None:
        """None until there is a pace, and a finished request or max_tokens to size by."""
        stats, metrics = progress.engine.stats, progress.metrics
        pooling = getattr(progress.engine, "pooler_config", None) is not None
        made = metrics.num_completed if pooling else stats.num_generation_tokens
        self.samples.append((now, made, stats.num_steps))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        if progress.total is None:
            return None
        num_left = progress.total - progress.num_done
        if num_left <= 0:
            return 0.0
        max_tokens = progress.max_output_tokens
        (t0, tokens0, steps0), (t1, tokens1, steps1) = self.samples[0], self.samples[-1]
        if pooling:  # tokens: requests completed
            return num_left * (t1 - t0) / (tokens1 - tokens0) if tokens1 > tokens0 else None
        if t1 <= t0 or tokens1 <= tokens0 or (metrics.num_completed == 0 and max_tokens is None):
            return None
        running_tokens = max(stats.num_generation_tokens - metrics.num_output_tokens, 0)
        weight = PRIOR_REQUESTS / (PRIOR_REQUESTS + metrics.num_completed)
        mean = metrics.num_output_tokens / max(metrics.num_completed, 1)
        if max_tokens is not None:
            mean += weight * max(max_tokens - mean, 0)
        tokens_left = max(num_left * mean - running_tokens, 0.0)
        throughput = tokens_left / ((tokens1 - tokens0) / (t1 - t0))
        if stats.num_running == 0 or steps1 <= steps0:
            return throughput
        made = running_tokens / stats.num_running
        longest = metrics.max_num_output_tokens
        if max_tokens is not None and (made >= longest or metrics.num_completed == 0):
            longest = max_tokens
        tail = max(longest - made, 0.0) * (t1 - t0) / (steps1 - steps0)
        return max(throughput, tail)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
