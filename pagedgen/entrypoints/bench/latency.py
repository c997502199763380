import statistics
import time
from collections.abc import Callable

from transformers import PreTrainedModel

from pagedgen.entrypoints.bench.engines import run_generate_batch, static_generate
from pagedgen.entrypoints.bench.roofline import Roofline
from pagedgen.entrypoints.bench.workloads import Workload
from pagedgen.entrypoints.llm import LLM
from pagedgen.sampling_params import SamplingParams

TimedRun = Callable[[int], float]  # max_tokens -> seconds for one request of that length


def measure_latency(timed: TimedRun, output_len: int, num_iters: int) -> dict:
    """Batch-1 latency: the median time of a 1-token run (prefill and the first token) and of an
    output_len-token run; each further token costs their difference over output_len - 1."""
    first = statistics.median(timed(1) for _ in range(num_iters))
    full = statistics.median(timed(output_len) for _ in range(num_iters))
    per_token = (full - first) / max(output_len - 1, 1)
    return {
        "time_to_first_token_s": first,
        "decode_latency_ms_per_token": 1000 * per_token,
        "decode_tokens_per_s": 1 / per_token if per_token > 0 else float("inf"),
        "elapsed_s": full,
        "output_tokens_per_s": output_len / full,
    }


def wall_time(run: Callable[[int], object]) -> TimedRun:
    def timed(max_tokens: int) -> float:
        start = time.perf_counter()
        run(max_tokens)
        return time.perf_counter() - start

    return timed


def pagedgen_latency(llm: LLM, workload: Workload, num_iters: int) -> dict:
    prompt = workload.prompts[0]

    def run(max_tokens: int) -> object:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate([prompt], params, use_tqdm=False)

    return measure_latency(wall_time(run), workload.max_tokens[0], num_iters)


def static_latency(
    model: PreTrainedModel, workload: Workload, pad_token_id: int, num_iters: int
) -> dict:
    prompt = workload.prompts[0]
    run = wall_time(lambda max_tokens: static_generate(model, [prompt], max_tokens, pad_token_id))
    return measure_latency(run, workload.max_tokens[0], num_iters)


def generate_batch_latency(
    model: PreTrainedModel, workload: Workload, max_batch_tokens: int, num_iters: int
) -> dict:
    """The continuous batching manager is built and torn down outside each timed request."""

    def timed(max_tokens: int) -> float:
        one = Workload(workload.name, workload.prompts[:1], [max_tokens], workload.prompt_format)
        return run_generate_batch(model, one, max_batch_tokens, 1).elapsed

    return measure_latency(timed, workload.max_tokens[0], num_iters)


def latency_runs(
    llm: LLM,
    model: PreTrainedModel | None,
    workload: Workload,
    pad_token_id: int,
    roofline: Roofline | None,
    baselines: list[str],
    num_iters: int,
) -> dict:
    """pagedgen's batch-1 latency and the baselines' (static: one for all static*), each with
    its share of the roofline's steps and pagedgen's speedup over it."""
    num_iters = max(num_iters, 3)
    runs = {"pagedgen": pagedgen_latency(llm, workload, num_iters)}
    if any(name.startswith("static") for name in baselines):
        runs["static"] = static_latency(model, workload, pad_token_id, num_iters)
    if "generate_batch" in baselines:
        max_batch_tokens = llm.engine.scheduler.max_num_batched_tokens
        runs["generate_batch"] = generate_batch_latency(
            model, workload, max_batch_tokens, num_iters
        )
    ours = runs["pagedgen"]
    for run in runs.values():
        if roofline is not None:
            run["bandwidth_share"] = run["decode_tokens_per_s"] / roofline.max_steps_per_s
        if run is not ours:
            run["pagedgen_decode_speedup"] = (
                ours["decode_tokens_per_s"] / run["decode_tokens_per_s"]
            )
            run["pagedgen_tokens_per_s_ratio"] = (
                ours["output_tokens_per_s"] / run["output_tokens_per_s"]
            )
    return runs
