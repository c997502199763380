"""What the engine asks of whatever runs the model, and a runner that runs none."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.core.step_timer import StepTimer
from pagedgen.lora.request import LoRARequest

if TYPE_CHECKING:
    from pagedgen.worker.prompt_logprobs import PromptLogprobs


class SamplerOutput(NamedTuple):
    token_ids: list[int]
    # Per row: {sampled token: logprob, then the top-k tokens in descending order}, from the raw
    # model logits; None for rows that did not ask. The whole field is None when no row asked.
    logprobs: list[dict[int, float] | None] | None
    # The prompt logprobs the step's prefill rows computed, for sequences that ask for them.
    prompt_logprobs: "list[PromptLogprobs] | None" = None
    # A pooling runner's step samples nothing: each sample_seqs entry's embedding, in order.
    pooler_output: list[Any] | None = None


class PendingOutput(Protocol):
    """A step's samples, maybe still being computed; result() waits for them."""

    def result(self) -> SamplerOutput: ...


class ReadyOutput(NamedTuple):
    output: SamplerOutput

    def result(self) -> SamplerOutput:
        return self.output


class WithPromptLogprobs(NamedTuple):
    """A step's pending samples and the prompt logprobs it computed (already on the host)."""

    pending: PendingOutput
    prompt_logprobs: "list[PromptLogprobs]"

    def result(self) -> SamplerOutput:
        return self.pending.result()._replace(prompt_logprobs=self.prompt_logprobs)


class InFlightStep(NamedTuple):
    """A step queued on the device whose samples the host has not processed yet."""

    scheduled: SchedulerOutput
    pending: PendingOutput
    queued: float  # seconds the host took to queue it


class Runner(Protocol):
    """Runs one scheduled step: moves the blocks it names, computes its tokens into the KV
    cache, and samples one token per scheduled.sample_seqs entry, in that order.

    execute_async returns as soon as the step is queued on the device. A sequence of the step
    whose last token is a PLACEHOLDER takes as its input the token the previous step (the one
    executed last) sampled for it, on the device, before the host has seen it."""

    timer: StepTimer

    def execute(self, scheduled: SchedulerOutput) -> SamplerOutput: ...

    def execute_async(self, scheduled: SchedulerOutput) -> PendingOutput: ...

    def add_lora(self, request: LoRARequest) -> None:
        """Makes an adapter ready for the steps of sequences with its lora_int_id; raises
        ValueError if it cannot run."""


class NullRunner:
    """Runs no model: each sampled sequence gets next_token(seq), and each of its draft tokens
    next_token of a copy of it with the drafts before appended. The simulator of `pagedgen
    profile` and the engine-loop tests drive the real engine with it."""

    def __init__(self, next_token: Callable[[Sequence], int]) -> None:
        self.next_token = next_token
        self.timer = StepTimer()

    def execute(self, scheduled: SchedulerOutput) -> SamplerOutput:
        token_ids = []
        for seq in scheduled.sample_seqs:
            token_ids.append(self.next_token(seq))
            drafts = scheduled.spec_token_ids.get(seq.seq_id, [])
            for i in range(1, len(drafts) + 1):
                token_ids.append(self.next_token(seq.with_drafts(drafts[:i])))
        return SamplerOutput(token_ids, None)

    def execute_async(self, scheduled: SchedulerOutput) -> PendingOutput:
        """Sequences must end in known tokens: next_token reads them."""
        return ReadyOutput(self.execute(scheduled))

    def add_lora(self, request: LoRARequest) -> None:
        pass
