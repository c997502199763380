"""Decode steps replayed on the CPU: the CPU counterpart of a CUDA graph.

At small batches a CPU decode step is mostly the weights streaming through the matmuls, plus a
fixed cost of Python between the kernel calls (module calls, argument checks, ~20 % of a
batch-1 step of SmolLM2). A CpuGraph records one eager forward as the flat list of what it
computed: each C kernel call (kernels/cpu_build.record_calls) and each torch op (a dispatch
mode) in order. replay() runs that list again and nothing else, each run of consecutive kernel
calls by one C loop (kernels/call_list.CallList): a batch-1 step of SmolLM2 is one such run of
271 calls between a few torch ops.

A recording holds only where every step is one of these:
- a C kernel call: replayed with the same arguments (pointers into the same tensors);
- a torch op that writes in place or to out=: called again;
- a torch op that returns new tensors: called again, its results copied into the recorded ones;
- a view, or an allocation (empty, empty_like): nothing to redo, the recorded tensor is kept.
An op that hands a value back to Python (item(), tolist(), a bool of a tensor) refuses the
recording: a replay would not recompute the branch taken on it. So does a replay that differs
from the eager forward once every recorded result has been set to NaN first, which catches a
computation that reached neither the dispatcher nor record_calls (it would be missing from
every replay).

Like CUDA graphs, the inputs are read from the buffers the recorded forward read, and every
tensor created during the recording stays allocated for the graph's lifetime. As CUDA graphs
share one memory pool, the tensors a recording allocates (torch.empty and its kin: the outputs
of every C kernel) come from one Arena for all of an engine's graphs, which never run at once
and recompute everything they hold on each replay (the NaN check proves it of each); the
largest, recorded first, sizes it.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedgen.kernels.call_list import CallList, can_list
from pagedgen.kernels.cpu_build import CpuKernelUnavailable, record_calls
from pagedgen.worker.cuda_graphs import GraphCapture, graph_batch_sizes

MAX_BATCH_SIZE = 64  # beyond, the Python between kernels is a few % of a step
BUCKET_STEP = 8  # past 8 rows, a padding row costs what a real one does: buckets stay close
ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
ALIGNMENT = 64  # bytes, an arena tensor's start: a cache line
CHUNK_BYTES = 64 << 20


class CaptureRefused(RuntimeError):
    """The forward cannot be replayed from a recording; run it eagerly."""


def cpu_graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, capped at max_num_seqs (always one): up to ~16 rows a
    decode step is bound by streaming the weights, so a padding row costs next to nothing;
    past that it costs a row's compute, so a step pads by fewer than 8."""
    top = min(max_num_seqs, MAX_BATCH_SIZE)
    sizes = {*graph_batch_sizes(min(top, 8)), *range(BUCKET_STEP, top, BUCKET_STEP), top}
    return sorted(sizes)


class Arena:
    """Memory for the tensors recordings allocate, handed out from the start again for each
    recording: the engine's graphs share it."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self.reset()

    def reset(self) -> None:
        self.chunk, self.offset = 0, 0

    def take(self, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        nbytes = -(-numel * dtype.itemsize // ALIGNMENT) * ALIGNMENT
        while (
            self.chunk < len(self.chunks) and self.offset + nbytes > self.chunks[self.chunk].numel()
        ):
            self.chunk, self.offset = self.chunk + 1, 0
        if self.chunk == len(self.chunks):
            self.chunks.append(torch.empty(max(nbytes, CHUNK_BYTES), dtype=torch.uint8))
        start, self.offset = self.offset, self.offset + nbytes
        data = self.chunks[self.chunk][start : start + numel * dtype.itemsize]
        return data.view(dtype).view(shape)


def _arena_allocation(arena: Arena, func, args, kwargs) -> torch.Tensor | None:
    """A contiguous CPU tensor from the arena for an allocation op, or None where the op asks
    for something else (a layout, device or strides of its own)."""
    name = func.overloadpacket.__name__
    if name == "empty" and func.__name__ == "empty.memory_format":
        shape, like = list(args[0]), None
    elif name == "empty_like":
        like = args[0]
        shape = list(like.shape)
    else:
        return None
    dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
    device = kwargs.get("device") or (like.device if like is not None else torch.device("cpu"))
    layout = kwargs.get("layout") or torch.strided
    memory_format = kwargs.get("memory_format")
    if torch.device(device).type != "cpu" or layout != torch.strided or kwargs.get("pin_memory"):
        return None
    if like is not None and not like.is_contiguous() and memory_format != torch.contiguous_format:
        return None
    return arena.take(shape, dtype)


def _tensors(value) -> list[torch.Tensor]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [x for x in items if isinstance(x, torch.Tensor)]


def _storage(x: torch.Tensor) -> int:
    """Where x's data lives: the same for a tensor and its views."""
    if x.layout != torch.strided:  # oneDNN's packed weights have no storage to ask
        return id(x)
    return x.untyped_storage().data_ptr()


class _Recompute:
    __slots__ = ("func", "args", "kwargs", "outputs")

    def __init__(self, func, args, kwargs, outputs: list[torch.Tensor]) -> None:
        self.func, self.args, self.kwargs, self.outputs = func, args, kwargs, outputs

    def __call__(self) -> None:
        results = _tensors(self.func(*self.args, **self.kwargs))
        for recorded, result in zip(self.outputs, results):
            recorded.copy_(result)


class _KernelCall:
    __slots__ = ("fn", "args", "status")

    def __init__(self, fn: Callable[..., int], args: tuple, status: int) -> None:
        self.fn, self.args, self.status = fn, args, status

    def __call__(self) -> None:
        status = self.fn(*self.args)
        if status != self.status:
            raise RuntimeError(f"{self.fn.__name__} returned {status} in a CPU graph replay")


def _listed(steps: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """steps with each run of consecutive kernel calls made one CallList step (one call from
    Python for the run), where the calls' signatures let it be built."""
    out: list[Callable[[], None]] = []
    run: list[_KernelCall] = []
    for step in [*steps, None]:
        if isinstance(step, _KernelCall) and can_list(step.fn):
            run.append(step)
            continue
        if len(run) > 1:
            try:
                out.append(CallList([(call.fn, call.args, call.status) for call in run]))
            except (CpuKernelUnavailable, OSError):
                out.extend(run)
        else:
            out.extend(run)
        run = []
        if step is not None:
            out.append(step)
    return out


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps __torch_dispatch__ to keep Dynamo out, importing it (~3 s) first.
        return False

    def __init__(self, arena: Arena | None) -> None:
        super().__init__()
        self.arena = arena
        self.steps: list[Callable[[], None]] = []
        self.results: list[torch.Tensor] = []  # created while recording: kept, and poisoned

    def kernel_call(self, fn: Callable[..., int], args: tuple, status: int) -> None:
        self.steps.append(_KernelCall(fn, args, status))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.arena is not None and func.overloadpacket.__name__ in ALLOCATIONS:
            out = _arena_allocation(self.arena, func, args, kwargs)
            if out is not None:
                self.results.append(out)
                return out
        out = func(*args, **kwargs)
        outputs = list(out) if isinstance(out, (list, tuple)) else [out]
        if not all(isinstance(x, torch.Tensor) for x in outputs):
            raise CaptureRefused(f"{func} hands a value back to Python")
        if func._schema.is_mutable:
            self.steps.append(lambda: func(*args, **kwargs))
            return out
        inputs = {_storage(x) for x in _tensors([*args, *kwargs.values()])}
        fresh = [x for x in outputs if _storage(x) not in inputs]
        if not fresh:  # a view
            return out
        self.results.extend(fresh)
        if func.overloadpacket.__name__ not in ALLOCATIONS:
            self.steps.append(_Recompute(func, args, kwargs, outputs))
        return out


class CpuGraph:
    """One recorded forward; replay() recomputes output in place from what its inputs hold."""

    def __init__(self, run: Callable[[], torch.Tensor], arena: Arena | None = None) -> None:
        recorder = _Recorder(arena)
        with record_calls(recorder.kernel_call), recorder:
            self.output = run()
        self.steps = _listed(recorder.steps)
        self.results = recorder.results
        self._validate()

    def replay(self) -> None:
        for step in self.steps:
            step()

    def _validate(self) -> None:
        expected = self.output.clone()
        for result in self.results:
            if result.is_floating_point():
                result.fill_(float("nan"))
        self.replay()
        if not torch.equal(self.output, expected):
            raise CaptureRefused(
                "a replay differs from the eager forward: part of it ran outside the kernels "
                "and torch ops a recording sees"
            )


def cpu_graph_capture() -> GraphCapture:
    """DecodeGraphs' capture for the CPU: the first call builds the kernels and fills caches
    outside the recording, as a CUDA capture's warm-up run does. Its recordings share one
    Arena."""
    warm, arena = False, Arena()

    def capture(run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        nonlocal warm
        if not warm:
            run()
            warm = True
        arena.reset()
        graph = CpuGraph(run, arena)
        return graph.replay, graph.output

    return capture


class CpuPieces:
    """PiecewiseGraphs' pieces on the CPU: each a recording, as CpuGraph's; a bucket's pieces
    allocate from one Arena, which every bucket starts over (their replays never interleave)."""

    def __init__(self) -> None:
        self.arena = Arena()
        self.recorder: _Recorder | None = None
        self.stack = ExitStack()
        self.results: list[torch.Tensor] = []

    @contextmanager
    def session(self) -> Iterator[None]:
        self.arena.reset()
        self.results = []
        try:
            yield
        finally:
            self.stack.close()  # a piece a failed capture left recording

    def begin(self) -> None:
        self.recorder = _Recorder(self.arena)
        self.stack.enter_context(record_calls(self.recorder.kernel_call))
        self.stack.enter_context(self.recorder)

    def end(self) -> Callable[[], None]:
        self.stack.close()
        steps = _listed(self.recorder.steps)
        self.results += self.recorder.results

        def replay() -> None:
            for step in steps:
                step()

        return replay

    def poison(self) -> None:
        for result in self.results:
            if result.is_floating_point():
                result.fill_(float("nan"))
