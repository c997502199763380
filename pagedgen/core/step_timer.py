"""Named sections of an engine step, for whoever wants to time them (pagedgen bench)."""

from contextlib import AbstractContextManager, nullcontext

STEP_PARTS = (
    "scheduler",
    "block_manager",
    "prepare_inputs",
    "model_forward",
    "structured_output",
    "sampling_metadata",
    "sampler",
    "detokenize_stop",
)

_NO_SECTION = nullcontext()


class StepTimer:
    """The engine and its runner wrap each part of a step in `with timer.section(name):`.
    This one times nothing; bench.overhead's StepProfiler, set as engine.timer, times them."""

    def section(self, name: str) -> AbstractContextManager[None]:
        return _NO_SECTION
