"""Runs engine steps under torch.profiler, apart from the timed passes, for bench.gpu_profile:
a window of steady decode steps, and one of mixed steps, where new prompts join a full batch."""

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import NamedTuple, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.step_timer import StepTimer
from pagedgen.entrypoints.bench.engines import greedy_params
from pagedgen.entrypoints.bench.gpu_profile import (
    DEVICE_KINDS,
    SECTION_ANNOTATION,
    STEP_ANNOTATION,
    GpuProfile,
    profiled_events,
    summarize,
)
from pagedgen.entrypoints.bench.workloads import Workload
from pagedgen.entrypoints.llm import LLM

T = TypeVar("T")


class AnnotatingTimer(StepTimer):
    """Marks each section of a step for the profiler (SECTION_ANNOTATION + its name)."""

    def section(self, name: str) -> record_function:
        return record_function(SECTION_ANNOTATION + name)


def profile_decode_steps(llm: LLM, workload: Workload, max_num_steps: int) -> GpuProfile:
    """Runs the workload's first max_num_seqs requests afresh up to their first decode-only
    step, then profiles the next max_num_steps steps (after one warm-up step) and aborts them.

    The window is the steady decode of a full batch: no request waits, so no prefill joins a
    step, nor (with async scheduling) runs on the device while a decode step is annotated.
    Each step is annotated whole (schedule, model, sampling, stop checks), so host time between
    kernels shows as idle device time. Steps that compute any prompt token are left out. The
    figures are taken under the profiler, which adds its own cost to every CUDA call. The engine
    is left as it was found: unpatched, with no request of this pass.
    """
    num_requests = min(workload.num_requests, llm.engine.scheduler.max_num_seqs)
    return _profile(llm, workload, num_requests, max_num_steps, phase="decode")


def profile_mixed_steps(llm: LLM, workload: Workload, max_num_steps: int) -> GpuProfile:
    """As profile_decode_steps, over the steps that compute prompt tokens once the whole
    workload runs and its first request has finished: new prompts then join running decodes,
    as in most steps of a long batch job (eager steps: no decode graph serves them)."""
    return _profile(llm, workload, workload.num_requests, max_num_steps, phase="mixed")


class Window(NamedTuple):
    """One run of a profile's window: the steps it counts (their index in the window), their
    host wall times, the context tokens their attention read, the tokens they computed, the
    profiler if one ran, and each step's context tokens."""

    steps: list[int]
    step_s: list[float]
    kv_tokens: int
    num_tokens: int
    profiler: profile | None
    step_kv_tokens: list[int]


def _profile(
    llm: LLM, workload: Workload, num_requests: int, max_num_steps: int, phase: str
) -> GpuProfile:
    """The window run twice, alike: timed alone, then under the profiler, whose own cost on
    every op and CUDA call slows the host; the device's work is the same in both."""
    plain = run_window(llm, workload, num_requests, max_num_steps, phase, traced=False)
    traced = run_window(llm, workload, num_requests, max_num_steps, phase, traced=True)
    events = profiled_events(traced.profiler)
    # Without CUPTI the trace holds no device event at all: unmeasured, which is not idle.
    on_gpu = llm.engine.runner.device.type == "cuda"
    device_traced = on_gpu and any(e.kind in DEVICE_KINDS for e in events)
    names = {f"{STEP_ANNOTATION}{i}" for i in traced.steps}
    profiled = summarize(events, names, device_traced=device_traced)
    plain_step_s = sum(plain.step_s) / len(plain.step_s) if plain.step_s else None
    return profiled._replace(
        kv_tokens=traced.kv_tokens,
        num_tokens=traced.num_tokens,
        phase=phase,
        plain_step_s=plain_step_s,
    )


def run_window(
    llm: LLM,
    workload: Workload,
    num_requests: int,
    max_num_steps: int,
    phase: str,
    traced: bool,
    around: AbstractContextManager | None = None,
) -> Window:
    """The workload's first num_requests requests afresh up to the window's first step (a
    decode-only step, or the first finish for "mixed"), then up to max_num_steps + 1 steps,
    under the profiler if traced, inside around if given; their requests aborted after."""
    engine, runner = llm.engine, llm.engine.runner
    on_gpu = runner.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(runner.device)) if on_gpu else (lambda: None)
    if not llm.reset_prefix_cache():  # its prompts are computed, as in the timed passes
        raise RuntimeError("requests are still running: the prefix cache cannot be reset")
    decode = phase == "decode"
    # per step that ran the model: did it compute decodes only, the tokens its attention read
    # and the tokens it computed
    is_decode: list[bool] = []
    context_tokens: list[int] = []
    computed_tokens: list[int] = []
    observed = (is_decode, context_tokens, computed_tokens)
    runner.execute = _observe(runner.execute, *observed)
    runner.execute_async = _observe(runner.execute_async, *observed)
    request_ids = [f"gpu-profile-{i}" for i in range(num_requests)]
    steps, step_s, step_kv_tokens, num_tokens = [], [], [], 0
    try:
        for request_id, prompt, params in zip(
            request_ids, workload.prompts, greedy_params(workload)
        ):
            engine.add_request(request_id, prompt, params)
        ready = (lambda: is_decode and is_decode[-1]) if decode else _first_finish(engine)
        while engine.has_unfinished_requests() and not ready():
            engine.step()
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        profiler = profile(activities=activities) if traced else None
        annotated = _annotated(engine) if traced else nullcontext()
        with profiler or nullcontext(), annotated, around or nullcontext():
            for i in range(max_num_steps + 1):
                if not engine.has_unfinished_requests():
                    break
                num_executed = len(is_decode)
                start = time.perf_counter()
                with record_function(f"{STEP_ANNOTATION}{i}") if traced else nullcontext():
                    engine.step()
                elapsed = time.perf_counter() - start
                # Step 0 is left out: the first records after the profiler starts cost more.
                if i and len(is_decode) > num_executed and is_decode[-1] == decode:
                    steps.append(i)
                    step_s.append(elapsed)
                    step_kv_tokens.append(context_tokens[-1])
                    num_tokens += computed_tokens[-1]
            sync()
    finally:
        for name in ("execute", "execute_async"):
            with suppress(AttributeError):
                delattr(runner, name)
        for request_id in request_ids:
            engine.abort_request(request_id)
        ours = set(request_ids)
        engine.rejected = [r for r in engine.rejected if r.request_id not in ours]
    return Window(steps, step_s, sum(step_kv_tokens), num_tokens, profiler, step_kv_tokens)


def _first_finish(engine) -> Callable[[], bool]:
    """True once any request of the engine has finished (its output left the engine)."""
    num_unfinished = engine.num_unfinished_requests
    return lambda: engine.num_unfinished_requests < num_unfinished


@contextmanager
def _annotated(engine) -> Iterator[None]:
    timer = engine.timer
    engine.timer = AnnotatingTimer()
    try:
        yield
    finally:
        engine.timer = timer


def _observe(
    execute: Callable[[SchedulerOutput], T],
    is_decode: list[bool],
    context_tokens: list[int],
    computed_tokens: list[int],
) -> Callable[[SchedulerOutput], T]:
    def observed(scheduled: SchedulerOutput) -> T:
        is_decode.append(scheduled.num_decode_seqs == len(scheduled.seqs))
        context_tokens.append(sum(scheduled.num_computed_tokens) + scheduled.num_batched_tokens)
        computed_tokens.append(scheduled.num_batched_tokens)
        return execute(scheduled)

    return observed
