"""How busy the GPU is during pagedgen's decode steps, and how many kernels each step launches:
torch.profiler over a bounded window of engine steps, run apart from the timed passes."""

import re
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable
from contextlib import suppress
from typing import NamedTuple, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pagedgen.bench.engines import greedy_params
from pagedgen.bench.workloads import Workload
from pagedgen.engine.scheduler_output import SchedulerOutput
from pagedgen.llm import LLM

T = TypeVar("T")

# Kineto's activity types (libkineto ActivityType.cpp), as _KinetoEvent.activity_type() names them.
# Only these mark the device as busy: "gpu_user_annotation" (a record_function projected onto the
# GPU timeline) and "cuda_sync" are device events too, and would count the idle time they span.
DEVICE_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
API_KINDS = frozenset({"cuda_runtime", "cuda_driver"})  # CuPy's RawKernel launches via the driver
KERNEL_LAUNCHES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
# Calls in which the host waits for the device
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    }
)
STEP_ANNOTATION = "pagedgen::step#"
TOP_KERNELS = 10
_API_SUFFIX = re.compile(r"(_ptsz|_ptds)?(_v\d+)?$")  # CUPTI's per-stream and version suffixes

Interval = tuple[float, float]


class ProfiledEvent(NamedTuple):
    name: str
    kind: str  # kineto's activity type: kernel, cuda_runtime, user_annotation, cpu_op, ...
    start: float  # ns, one clock for host and device events
    end: float


class GpuProfile(NamedTuple):
    """The profiled decode steps: their summed wall time, the part of it in which the device ran
    at least one kernel, copy or memset (None where no device was traced), and their launches."""

    num_decode_steps: int
    window_s: float
    busy_s: float | None
    num_kernel_launches: int
    num_graph_launches: int
    # The kernels that took the most device time within the steps, (label, seconds), most first
    kernel_s: tuple[tuple[str, float], ...] = ()
    # Time within the steps that the host spent in calls that wait for the device (SYNC_CALLS):
    # with the device idle too, the steps are serialized rather than host-bound.
    sync_wait_s: float = 0.0
    kv_tokens: int = 0  # context tokens the steps' attention read, all steps together

    @property
    def busy_perc(self) -> float | None:
        if self.busy_s is None or self.window_s <= 0:
            return None
        return 100 * self.busy_s / self.window_s

    def per_step(self, count: int) -> float | None:
        return count / self.num_decode_steps if self.num_decode_steps else None

    def to_dict(self) -> dict:
        return {
            **self._asdict(),
            "busy_perc": self.busy_perc,
            "kernel_launches_per_step": self.per_step(self.num_kernel_launches),
            "graph_launches_per_step": self.per_step(self.num_graph_launches),
            "kernel_s": dict(self.kernel_s),
            "sync_wait_perc": 100 * self.sync_wait_s / self.window_s if self.window_s else None,
        }


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of the intervals, as sorted disjoint intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def covered(merged: list[Interval], window: Interval) -> float:
    """How much of the window the merged (sorted, disjoint) intervals cover."""
    lo, hi = window
    first = bisect_right(merged, (lo, float("inf"))) - 1  # the last one starting at or before lo
    total = 0.0
    for start, end in merged[max(first, 0) :]:
        if start >= hi:
            break
        total += max(0.0, min(end, hi) - max(start, lo))
    return total


def busy_time(device: Iterable[Interval], windows: Iterable[Interval]) -> float:
    """Time within the windows that at least one device interval covers: concurrent kernels on
    several streams count once."""
    merged = merge(device)
    return sum(covered(merged, window) for window in windows)


def kernel_label(name: str) -> str:
    """A kernel's name without its template arguments and parameters:
    "void pagedgen::paged_attention_v1_kernel<__nv_bfloat16, ...>(...)" is
    "pagedgen::paged_attention_v1_kernel"."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or name


def kernel_times(
    events: Iterable[ProfiledEvent], windows: list[Interval], top: int = TOP_KERNELS
) -> tuple[tuple[str, float], ...]:
    """Device seconds within the (sorted, disjoint) windows by kernel label, the top ones."""
    totals: dict[str, float] = {}
    for e in events:
        if e.kind == "kernel":
            inside = covered(windows, (e.start, e.end))  # the kernel's time inside them
            if inside > 0:
                label = kernel_label(e.name)
                totals[label] = totals.get(label, 0.0) + inside / 1e9
    return tuple(sorted(totals.items(), key=lambda item: -item[1])[:top])


def launch_kind(name: str) -> str | None:
    """What a CUDA runtime or driver call launches: a "kernel", a "graph" or nothing (None)."""
    name = _API_SUFFIX.sub("", name)
    if name in KERNEL_LAUNCHES:
        return "kernel"
    return "graph" if name in GRAPH_LAUNCHES else None


def summarize(
    events: list[ProfiledEvent], step_names: Collection[str], device_traced: bool
) -> GpuProfile:
    """Busy time and launches within the steps annotated with step_names (the decode steps).

    A launch counts for the step its host call starts in; device time counts wherever it falls
    inside a step, whichever step launched it.
    """
    windows = sorted(
        (e.start, e.end) for e in events if e.kind == "user_annotation" and e.name in step_names
    )
    starts = [start for start, _ in windows]

    def in_window(t: float) -> bool:
        i = bisect_right(starts, t) - 1
        return i >= 0 and t <= windows[i][1]

    kinds = [launch_kind(e.name) for e in events if e.kind in API_KINDS and in_window(e.start)]
    waits = [
        (e.start, e.end)
        for e in events
        if e.kind in API_KINDS and _API_SUFFIX.sub("", e.name) in SYNC_CALLS
    ]
    device = [(e.start, e.end) for e in events if e.kind in DEVICE_KINDS]
    return GpuProfile(
        num_decode_steps=len(windows),
        window_s=sum(end - start for start, end in windows) / 1e9,
        busy_s=busy_time(device, windows) / 1e9 if device_traced else None,
        num_kernel_launches=kinds.count("kernel"),
        num_graph_launches=kinds.count("graph"),
        kernel_s=kernel_times(events, windows) if device_traced else (),
        sync_wait_s=busy_time(waits, windows) / 1e9,
    )


def profile_decode_steps(llm: LLM, workload: Workload, max_num_steps: int) -> GpuProfile:
    """Runs the workload afresh up to its first decode-only step, then profiles the next
    max_num_steps steps (after one warm-up step) and aborts the rest of the workload.

    Each step is annotated whole (schedule, model, sampling, stop checks), so host time between
    kernels shows as idle device time. Steps that compute any prompt token are left out. The
    figures are taken under the profiler, which adds its own cost to every CUDA call. The engine
    is left as it was found: unpatched, with no request of this pass.
    """
    engine, runner = llm.engine, llm.engine.runner
    on_gpu = runner.device.type == "cuda"
    if not llm.reset_prefix_cache():  # its prompts are computed, as in the timed passes
        raise RuntimeError("requests are still running: the prefix cache cannot be reset")
    is_decode: list[bool] = []  # per step that ran the model: did it compute decodes only
    context_tokens: list[int] = []  # and the tokens its attention read
    runner.execute = _observe(runner.execute, is_decode, context_tokens)
    runner.execute_async = _observe(runner.execute_async, is_decode, context_tokens)
    kv_tokens = 0
    request_ids = [f"gpu-profile-{i}" for i in range(workload.num_requests)]
    step_names: list[str] = []
    try:
        for request_id, prompt, params in zip(
            request_ids, workload.prompts, greedy_params(workload)
        ):
            engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests() and not (is_decode and is_decode[-1]):
            engine.step()
        activities = (
            [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
        )
        with profile(activities=activities) as profiler:
            for i in range(max_num_steps + 1):
                if not engine.has_unfinished_requests():
                    break
                num_executed = len(is_decode)
                with record_function(f"{STEP_ANNOTATION}{i}"):
                    engine.step()
                # Step 0 is left out: the first records after the profiler starts cost more.
                if i and len(is_decode) > num_executed and is_decode[-1]:
                    step_names.append(f"{STEP_ANNOTATION}{i}")
                    kv_tokens += context_tokens[-1]
            if on_gpu:
                torch.cuda.synchronize(runner.device)
    finally:
        for name in ("execute", "execute_async"):
            with suppress(AttributeError):
                delattr(runner, name)
        for request_id in request_ids:
            engine.abort_request(request_id)
        ours = set(request_ids)
        engine.rejected = [r for r in engine.rejected if r.request_id not in ours]
    events = _events(profiler)
    # Without CUPTI the trace holds no device event at all: unmeasured, which is not idle.
    traced = on_gpu and any(e.kind in DEVICE_KINDS for e in events)
    return summarize(events, set(step_names), device_traced=traced)._replace(kv_tokens=kv_tokens)


def _observe(
    execute: Callable[[SchedulerOutput], T], is_decode: list[bool], context_tokens: list[int]
) -> Callable[[SchedulerOutput], T]:
    def observed(scheduled: SchedulerOutput) -> T:
        is_decode.append(scheduled.num_decode_seqs == len(scheduled.seqs))
        context_tokens.append(sum(scheduled.num_computed_tokens) + scheduled.num_batched_tokens)
        return execute(scheduled)

    return observed


def _events(profiler: profile) -> list[ProfiledEvent]:
    # The raw kineto events, not profiler.events(): building FunctionEvents costs ~25x more,
    # tens of seconds for the ~10^5 events of a few thousand launches per step.
    results = profiler.profiler.kineto_results
    return [
        ProfiledEvent(e.name(), event_kind(e), e.start_ns(), e.end_ns()) for e in results.events()
    ]


def event_kind(event: torch._C._autograd._KinetoEvent) -> str:
    """Kineto's activity type of a raw event. torch < 2.12 does not expose it: there it is told
    from where the event ran and its name, for the kinds summarize() reads."""
    if hasattr(event, "activity_type"):
        return event.activity_type()
    name, on_device = event.name(), event.device_type() != torch._C._autograd.DeviceType.CPU
    if event.is_user_annotation():
        return "gpu_user_annotation" if on_device else "user_annotation"
    if on_device:
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        return "cuda_sync" if name.endswith(" Sync") or name == "Stream Wait Event" else "kernel"
    return "cuda_runtime" if launch_kind(name) is not None else "cpu_op"
