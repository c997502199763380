import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pagedgen.config import EngineConfig
from pagedgen.core.beam_search import BeamSearchParams
from pagedgen.core.control_plane import build_control_plane
from pagedgen.core.request import Request, build_request
from pagedgen.core.runner import InFlightStep, Runner, SamplerOutput
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import SequenceStatus
from pagedgen.core.stats import EngineStats
from pagedgen.core.step_timer import StepTimer
from pagedgen.core.stop_checker import StopChecker, Tokenizer
from pagedgen.engine.output_processor import OutputProcessor
from pagedgen.engine.structured_output.manager import StructuredOutputManager
from pagedgen.lora.request import LoRARequest
from pagedgen.outputs import PoolingRequestOutput, RequestOutput
from pagedgen.pooling import PoolerConfig, PoolingParams
from pagedgen.pooling.params import for_runner
from pagedgen.sampling_params import SamplingParams

Prompt = str | list[int]
Params = SamplingParams | BeamSearchParams | PoolingParams
Output = RequestOutput | PoolingRequestOutput


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


class LLMEngine:
    """Adds requests and runs steps: schedule, run the model, sample, stop, free.

    The loop, in step(): Scheduler.schedule() decides the step and counts it as computed; the
    runner executes it and samples one token per sampling sequence; the engine appends each
    token, the stop checker finishes sequences, the scheduler frees them. step() returns the
    requests that finished during it, so callers can stream results while the rest keep running.

    The engine is plain Python: the runner is given (from_config builds the real one, with the
    model and the KV cache; `pagedgen profile --simulate` and the tests give a NullRunner).

    A request with structured_outputs waits for its grammar, compiled on another thread, before
    it reaches the scheduler; each step then masks the logits of its sequences' rows, and its
    grammar advances with every token appended.

    With config.async_scheduling, step() schedules and queues step N + 1 before it processes
    step N's samples (vLLM's async scheduling): each sequence step N sampled for carries a
    PLACEHOLDER as its last token, which step N + 1 reads on the device. The host's work then
    overlaps the device's; a sequence that step N finishes has computed one token in vain in
    step N + 1. Steps run one at a time while any unfinished request needs its tokens on the
    host before its next step (beam search, structured outputs, penalties).

    With a pooler_config (vLLM's pooling runner), requests are PoolingParams: the step that
    completes a prompt pools its hidden states into its embedding and ends it.
    """

    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        tokenizer: Tokenizer | None,
        num_blocks: int,
        num_cpu_blocks: int,
        max_model_len: int,
        eos_token_ids: set[int],
        *,
        sliding_window: int | None = None,  # blocks past it are freed (freeable_window)
        vocab_size: int | None = None,  # the logits' width; default: the tokenizer's
        pooler_config: PoolerConfig | None = None,  # a pooling runner's: it embeds prompts
    ) -> None:
        self.config = config
        self.pooler_config = pooler_config
        self.hf_config: Any = None  # the model's config, when from_config loaded one
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.block_manager, self.scheduler = build_control_plane(
            config, num_blocks, num_cpu_blocks, max_model_len, sliding_window
        )
        self.stop_checker = StopChecker(tokenizer, max_model_len)
        self.vocab_size = vocab_size or (len(tokenizer) if tokenizer is not None else 0)
        self.structured_output = StructuredOutputManager(
            tokenizer, self.vocab_size, eos_token_ids, config.reasoning_parser
        )
        self.output_processor = OutputProcessor(
            self.scheduler, self.stop_checker, self.structured_output, config.speculative_config
        )
        self.requests: dict[str, Request] = {}
        self.rejected: list[Request] = []
        self.stats = EngineStats(spec_decode=self.output_processor.spec_decode_stats)
        self.timer = StepTimer()
        self.in_flight: InFlightStep | None = None
        self.num_sync_requests = 0  # unfinished requests that rule out async steps

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def timer(self) -> StepTimer:
        return self._timer

    @timer.setter
    def timer(self, timer: StepTimer) -> None:
        """One timer for the engine's sections and its runner's."""
        self._timer = timer
        self.runner.timer = timer

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: Params | None = None,
        lora_request: LoRARequest | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queues a prompt (text, or token ids) for sampling, parallel sampling or beam search,
        or for its embedding, with a LoRA adapter if given (loaded at its first request)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        params = for_runner(params, self.pooler_config and self.pooler_config.task)
        if lora_request is not None:
            self.add_lora(lora_request)
        request = build_request(
            self.scheduler.new_sequence,
            self.tokenizer,
            self.eos_token_ids,
            request_id,
            prompt,
            params,
            lora_request,
            arrival_time,
        )
        sampling_params = request.group.sampling_params
        self.num_sync_requests += request.needs_sync_steps
        error = request.refusal(self.vocab_size, self.hf_config)
        if error is not None:
            self._schedule(request, error)
            return
        if sampling_params.structured_outputs is None:
            self._schedule(request, self.scheduler.add(request.group))
            return
        error = self.structured_output.add_request(request_id, sampling_params.structured_outputs)
        if error is not None:
            self._schedule(request, error)
        else:
            self.requests[request_id] = request  # the scheduler gets it once its grammar is ready

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Reads and checks an adapter (once per lora_int_id); raises ValueError if it cannot
        run here."""
        if self.scheduler.max_loras is None:
            raise ValueError("LoRA requests need an engine built with enable_lora=True")
        self.runner.add_lora(lora_request)

    def abort_all(self) -> None:
        """Drops every request, those already rejected too: what an exception left queued."""
        for request_id in list(self.requests):
            self.abort_request(request_id)
        self.rejected.clear()

    def _schedule(self, request: Request, error: str | None) -> None:
        """Keeps a request the scheduler took, or rejects it for the error."""
        if error is None:
            self.requests[request.request_id] = request
            return
        self._remove(request)
        request.group.seqs[0].finish(SequenceStatus.FINISHED_IGNORED, error)
        self.rejected.append(request)

    def _remove(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self.num_sync_requests -= request.needs_sync_steps

    def _admit_compiled(self) -> None:
        """Hands the scheduler the requests whose grammar is ready, and rejects those whose
        grammar failed; waits for one when the scheduler has nothing else to run."""
        block = not self.scheduler.has_unfinished()
        for request_id, error in self.structured_output.pop_ready(block):
            request = self.requests[request_id]
            self._schedule(request, error or self.scheduler.add(request.group))

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        self._remove(request)
        self.scheduler.abort(request.group)
        self.structured_output.free(request_id)
        for seq in request.group.unfinished_seqs:
            seq.drop_placeholders()
            seq.finish(SequenceStatus.FINISHED_ABORTED)
            self.scheduler.finish(seq)
            self.stop_checker.free(seq)

    def abort_unstarted_requests(self) -> list[str]:
        """Aborts every request none of whose tokens has been computed; returns their ids."""
        unstarted = [rid for rid, request in self.requests.items() if not request.is_started]
        for request_id in unstarted:
            self.abort_request(request_id)
        return unstarted

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self.rejected)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests) + len(self.rejected)

    def step(self) -> list[Output]:
        if self.structured_output.num_pending:
            self._admit_compiled()
        finished = [request.output(self.tokenizer) for request in self.rejected]
        self.rejected.clear()
        overlap = self.config.async_scheduling and not self.num_sync_requests
        if self.in_flight is not None and not overlap:
            finished += self.finish_in_flight()
        with self.timer.section("scheduler"):
            scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            if self.in_flight is not None:
                return finished + self.finish_in_flight()
            if self.scheduler.has_unfinished() and not finished:
                raise RuntimeError("the scheduler can make no progress; the KV pool is too small")
            return finished
        with self.timer.section("structured_output"):
            bitmask = self.structured_output.grammar_bitmask(scheduled.sample_row_seqs)
        if bitmask is not None:
            scheduled = scheduled._replace(grammar_bitmask=bitmask)
        start = time.perf_counter()
        if not overlap:
            samples = self.runner.execute(scheduled)
            return finished + self._process(scheduled, samples, time.perf_counter() - start)
        pending = self.runner.execute_async(scheduled)
        queued = time.perf_counter() - start
        finished += self.finish_in_flight()
        for seq in scheduled.sample_seqs:
            if not seq.is_finished:
                seq.append_placeholder()
        self.in_flight = InFlightStep(scheduled, pending, queued)
        return finished

    def finish_in_flight(self) -> list[Output]:
        """Waits for the step in flight, if any, and processes its samples."""
        if self.in_flight is None:
            return []
        step, self.in_flight = self.in_flight, None
        start = time.perf_counter()
        samples = step.pending.result()
        return self._process(step.scheduled, samples, step.queued + time.perf_counter() - start)

    def _process(
        self, scheduled: SchedulerOutput, samples: SamplerOutput, model_time: float
    ) -> list[Output]:
        """Applies a step's samples; returns the outputs of the requests that finished."""
        with self.timer.section("detokenize_stop"):
            num_sampled, done = self.output_processor.process(scheduled, samples, self.requests)
        self.stats.record_step(scheduled, model_time, num_sampled)
        finished = []
        for request in done:
            finished.append(request.output(self.tokenizer))
            self._remove(request)
            self.structured_output.free(request.request_id)
        self.stats.observe(self.scheduler)
        return finished

    def stream(
        self,
        requests: Iterable[tuple[str, Prompt, Params] | tuple[str, Prompt, Params, LoRARequest]],
        max_pending: int | None = None,
        on_step: Callable[["LLMEngine"], None] | None = None,
    ) -> Iterator[Output]:
        """Yields each request's output as soon as it finishes; a request is (id, prompt,
        params) or (id, prompt, params, lora_request). Requests are pulled only while fewer than
        max_pending (default: twice max_num_seqs) are unfinished: any input streams through in
        bounded memory while the batch stays full. on_step(engine) runs after every step, where
        the engine is consistent: it may read the gauges or abort requests."""
        max_pending = max_pending or 2 * self.config.max_num_seqs
        return self._stream(iter(requests), max_pending, on_step)

    def _stream(
        self,
        requests: Iterator[tuple],
        max_pending: int,
        on_step: Callable[["LLMEngine"], None] | None,
    ) -> Iterator[Output]:
        exhausted = False
        while True:
            while not exhausted and self.num_unfinished_requests < max_pending:
                request = next(requests, None)
                if request is None:
                    exhausted = True
                else:
                    self.add_request(*request)
            if not self.has_unfinished_requests():
                self.finish_in_flight()  # a step of finished sequences only
                return
            finished = self.step()
            if on_step is not None:
                on_step(self)
            yield from finished
