"""How busy the GPU is during pagedgen's steps, which kernels take its time, how many each step
launches and where the host spends each step: the arithmetic over torch.profiler's raw events of
annotated engine steps (bench.profile_steps runs and annotates them)."""

import re
from bisect import bisect_right
from collections.abc import Collection, Iterable
from typing import NamedTuple

import torch
from torch.profiler import profile

from pagedgen.core.step_timer import STEP_PARTS

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
SECTION_ANNOTATION = "pagedgen::"  # + a StepTimer section's name: host time of that part
TOP_KERNELS = 10
_API_SUFFIX = re.compile(r"(_ptsz|_ptds)?(_v\d+)?$")  # CUPTI's per-stream and version suffixes

Interval = tuple[float, float]


class ProfiledEvent(NamedTuple):
    name: str
    kind: str  # kineto's activity type: kernel, cuda_runtime, user_annotation, cpu_op, ...
    start: float  # ns, one clock for host and device events
    end: float


class GpuProfile(NamedTuple):
    """The profiled steps: their summed wall time, the part of it in which the device ran at
    least one kernel, copy or memset (None where no device was traced), and their launches."""

    num_steps: int
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
    num_tokens: int = 0  # tokens the steps computed (their rows), all steps together
    # Host seconds within the steps in each StepTimer section (SECTION_ANNOTATION + name), in
    # STEP_PARTS order: with async scheduling a step's device work overlaps them.
    host_s: tuple[tuple[str, float], ...] = ()
    phase: str = "decode"  # which steps: "decode" (decode-only) or "mixed" (with prompt tokens)
    # The same steps' mean wall time run again without the profiler, whose cost on every op and
    # CUDA call slows the host but not the device: None where not measured.
    plain_step_s: float | None = None

    @property
    def busy_perc(self) -> float | None:
        if self.busy_s is None or self.window_s <= 0:
            return None
        return 100 * self.busy_s / self.window_s

    @property
    def plain_busy_perc(self) -> float | None:
        """The device's time a step, as traced, against the steps' wall time unprofiled (at
        most 100: a bound, as a step's device work may overlap the next step's wall time)."""
        if self.busy_s is None or not self.plain_step_s or not self.num_steps:
            return None
        return min(100.0, 100 * self.busy_s / self.num_steps / self.plain_step_s)

    def per_step(self, count: int) -> float | None:
        return count / self.num_steps if self.num_steps else None

    def to_dict(self) -> dict:
        return {
            **self._asdict(),
            "busy_perc": self.busy_perc,
            "plain_busy_perc": self.plain_busy_perc,
            "kernel_launches_per_step": self.per_step(self.num_kernel_launches),
            "graph_launches_per_step": self.per_step(self.num_graph_launches),
            "kernel_s": dict(self.kernel_s),
            "host_s": dict(self.host_s),
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
    """Busy time, launches and host sections within the steps annotated with step_names.

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
    sections: dict[str, list[Interval]] = {}
    for e in events:
        part = e.name.removeprefix(SECTION_ANNOTATION)
        if e.kind == "user_annotation" and part in STEP_PARTS and part != e.name:
            sections.setdefault(part, []).append((e.start, e.end))
    host = [
        (part, busy_time(sections[part], windows) / 1e9) for part in STEP_PARTS if part in sections
    ]
    return GpuProfile(
        num_steps=len(windows),
        window_s=sum(end - start for start, end in windows) / 1e9,
        busy_s=busy_time(device, windows) / 1e9 if device_traced else None,
        num_kernel_launches=kinds.count("kernel"),
        num_graph_launches=kinds.count("graph"),
        kernel_s=kernel_times(events, windows) if device_traced else (),
        sync_wait_s=busy_time(waits, windows) / 1e9,
        host_s=tuple(host),
    )


def profiled_events(profiler: profile) -> list[ProfiledEvent]:
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
