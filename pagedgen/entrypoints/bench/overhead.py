import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import torch

from pagedgen.core.step_timer import STEP_PARTS, StepTimer
from pagedgen.engine.llm_engine import LLMEngine

# Each part's time is exclusive: a block manager call inside schedule() counts as block_manager.
PARTS = (*STEP_PARTS, "other")


@dataclass(slots=True)
class StepRecord:
    num_seqs: int = 0
    num_tokens: int = 0
    is_decode: bool = True
    total: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))


class StepProfiler(StepTimer):
    """Times the engine's parts inside every step: set as the engine's timer, it times the
    sections the engine and its runner mark; the block manager's calls are wrapped in place.

    Sections nest (schedule() calls the block manager); a stack turns inclusive times into
    exclusive ones, and whatever no section covers in a step is `other` (stats, bookkeeping).
    On a GPU the boundaries of outermost sections synchronize, which slows the run but keeps
    the split honest: the device work a section queued counts in it. Nested sections do not
    (the block manager, torch-free, queues none), or hundreds of syncs a step would be timed
    as the block manager's.
    """

    def __init__(self, device: torch.device) -> None:
        self.steps: list[StepRecord] = []
        self._stack: list[list[float]] = []  # [start, child time] per open wrapper
        self._sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        outermost = not self._stack
        if outermost:
            self._sync()
        self._stack.append([time.perf_counter(), 0.0])
        try:
            yield
        finally:
            if outermost:
                self._sync()
            start, children = self._stack.pop()
            elapsed = time.perf_counter() - start
            if self._stack:
                self._stack[-1][1] += elapsed
            if self.steps:
                self.steps[-1].parts[name] += elapsed - children

    def wrap(self, part: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            with self.section(part):
                return fn(*args, **kwargs)

        return timed

    def wrap_step(self, step: Callable) -> Callable:
        def timed_step(*args, **kwargs):
            self.steps.append(StepRecord())
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                record = self.steps[-1]
                record.total = time.perf_counter() - start
                record.parts["other"] = record.total - sum(record.parts.values())

        return timed_step

    def wrap_schedule(self, schedule: Callable) -> Callable:
        """Records the step's shape; the engine's "scheduler" section times it."""

        def schedule_and_record():
            scheduled = schedule()
            if self.steps:
                record = self.steps[-1]
                record.num_seqs = len(scheduled.seqs)
                record.num_tokens = scheduled.num_batched_tokens
                record.is_decode = record.num_tokens == record.num_seqs
            return scheduled

        return schedule_and_record

    def summary(self) -> dict:
        """Shares of step time per part over all steps, prefill steps and decode-only steps."""
        steps = [s for s in self.steps if s.num_seqs]
        kinds = {
            "all_steps": steps,
            "prefill_steps": [s for s in steps if not s.is_decode],
            "decode_steps": [s for s in steps if s.is_decode],
        }
        return {kind: _summarize(group) for kind, group in kinds.items() if group}


def _summarize(steps: list[StepRecord]) -> dict:
    total = sum(s.total for s in steps)
    return {
        "num_steps": len(steps),
        "mean_num_seqs": sum(s.num_seqs for s in steps) / len(steps),
        "max_num_seqs": max(s.num_seqs for s in steps),
        "mean_num_tokens": sum(s.num_tokens for s in steps) / len(steps),
        "mean_step_ms": 1000 * total / len(steps),
        "shares": {part: sum(s.parts[part] for s in steps) / total for part in PARTS},
    }


def _public_methods(obj: object) -> list[str]:
    return [
        name
        for name, attr in vars(type(obj)).items()
        if not name.startswith("_") and inspect.isfunction(attr) and name != "check_integrity"
    ]


def step_timers_synchronize(engine: LLMEngine) -> bool:
    """On a GPU the step timers synchronize at every outermost section's boundaries; on a CPU
    they cost ~1 us a call."""
    return engine.runner.device.type == "cuda"


@contextmanager
def profile_engine(engine: LLMEngine) -> Iterator[StepProfiler]:
    """Times one engine's steps for the duration of the block; everything is restored after."""
    profiler = StepProfiler(engine.runner.device)
    block_manager = engine.block_manager
    patches: list[tuple[object, str, Callable]] = [
        (engine, "step", profiler.wrap_step(engine.step)),
        (engine.scheduler, "schedule", profiler.wrap_schedule(engine.scheduler.schedule)),
    ]
    patches += [
        (block_manager, name, profiler.wrap("block_manager", getattr(block_manager, name)))
        for name in _public_methods(block_manager)
    ]
    timer = engine.timer
    engine.timer = profiler
    for obj, name, wrapper in patches:
        setattr(obj, name, wrapper)
    try:
        yield profiler
    finally:
        engine.timer = timer
        for obj, name, _ in patches:
            with suppress(AttributeError):
                delattr(obj, name)
