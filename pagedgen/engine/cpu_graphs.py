"""Decode steps replayed on the CPU: the CPU counterpart of a CUDA graph.

At small batches a CPU decode step is mostly the weights streaming through the matmuls, plus a
fixed cost of Python between the kernel calls (module calls, argument checks, ~20 % of a
batch-1 step of SmolLM2). A CpuGraph records one eager forward as the flat list of what it
computed: each C kernel call (kernels/cpu_build.record_calls) and each torch op (a dispatch
mode) in order. replay() runs that list again and nothing else.

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
tensor created during the recording stays allocated for the graph's lifetime.
"""

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedgen.engine.cuda_graphs import GraphCapture, graph_batch_sizes
from pagedgen.kernels.cpu_build import record_calls

MAX_BATCH_SIZE = 16  # beyond, the matmuls dominate a step and a bucket's padding rows cost more
ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


class CaptureRefused(RuntimeError):
    """The forward cannot be replayed from a recording; run it eagerly."""


def cpu_graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, capped at max_num_seqs (always one): up to 16 rows a decode step is
    bound by streaming the weights, so a padding row costs next to nothing."""
    return graph_batch_sizes(min(max_num_seqs, MAX_BATCH_SIZE))


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


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps __torch_dispatch__ to keep Dynamo out, importing it (~3 s) first.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Callable[[], None]] = []
        self.results: list[torch.Tensor] = []  # created while recording: kept, and poisoned

    def kernel_call(self, fn: Callable[..., int], args: tuple, status: int) -> None:
        self.steps.append(_KernelCall(fn, args, status))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
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

    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        recorder = _Recorder()
        with record_calls(recorder.kernel_call), recorder:
            self.output = run()
        self.steps = recorder.steps
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
    outside the recording, as a CUDA capture's warm-up run does."""
    warm = False

    def capture(run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        nonlocal warm
        if not warm:
            run()
            warm = True
        graph = CpuGraph(run)
        return graph.replay, graph.output

    return capture
