import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING, Any, NamedTuple

from pagedgen.cpu_load import allowed_cpus, others_busy, sample_cpu
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.entrypoints.batch.metrics import RunMetrics
from pagedgen.entrypoints.batch.requests import (
    RequestBuilder,
    RequestError,
    sampling_defaults,
    vocab_size_of,
)
from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.io.output import RecordFormatter
from pagedgen.entrypoints.io.output_file import OutputFile
from pagedgen.entrypoints.io.readers import InputSource
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.resume import resume_source
from pagedgen.entrypoints.io.writer import MAX_FAILED_LINES, OutputWriteError, RecordWriter
from pagedgen.lora.request import LoRARequest
from pagedgen.pooling.params import PoolingParams
from pagedgen.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedgen.entrypoints.llm import LLM

ORDERS = ("input", "completion")


class JobProgress(NamedTuple):
    num_done: int  # records in the output, those a resumed run found included
    total: int | None
    metrics: RunMetrics
    engine: LLMEngine
    num_stop_requests: int
    max_output_tokens: int | None = None  # of a request with the default sampling: the ETA's bound


@dataclass(slots=True)
class JobResult:
    num_records: int
    num_failed: int
    failed_lines: list[int]  # the first few input lines whose records are errors
    num_resumed: int  # records already in the output before this run
    interrupted: bool
    summary: dict[str, Any] = field(default_factory=dict)
    write_error: OutputWriteError | None = None  # the output refused a record; the job stopped


class BatchJob:
    """Runs every record of an input through an LLM and writes one output line for each.

    sampling holds the SamplingParams fields every record starts from; a record's own fields
    override them. A record that cannot run (bad input, a duplicate id, a prompt the model cannot
    take) becomes an error line and the job goes on. Records already in a resumed output are
    skipped, once the input is proven to be the one they answer (see resume_source). stop()
    (safe to call from a signal handler) stops admitting requests and lets the started ones
    finish; a second stop() aborts those too. If the output refuses a record (a full disk), the
    job aborts and reports it in JobResult.write_error. Whatever ends the job, the output stays a
    set of whole records that --resume continues from.
    """

    def __init__(
        self,
        llm: "LLM",
        source: InputSource,
        output: OutputFile,
        sampling: dict[str, Any] | None = None,
        order: str = "input",
        loras: dict[str, LoRARequest] | None = None,  # by name: what input lines may ask for
        chat_template: ChatTemplate = ChatTemplate(),  # how messages become prompts
        tool_call_parser: str | None = None,  # reads tool calls from chat answers (io/tools.py)
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.llm = llm
        self.engine = llm.engine
        pooler_config = llm.engine.pooler_config
        pooling = pooler_config.task if pooler_config is not None else None  # embed, classify
        self.builder = RequestBuilder(
            llm.tokenizer,
            sampling or {},
            vocab_size_of(llm.engine),
            llm.engine.config.max_num_seqs,
            llm.engine.max_model_len,
            loras,
            chat_template,
            tool_call_parser,
            pooling,
        )
        self.source = resume_source(source, output.state, output.path)
        self.output = output
        self.writer = RecordWriter(output.stream, ordered=order == "input")
        self.formatter = RecordFormatter(
            source.is_openai,
            llm.engine.config.model,
            llm.tokenizer,
            llm.engine.config.reasoning_parser,
            tool_call_parser,
            pooling,
        )
        defaults = sampling_defaults(self.builder.defaults)
        self.max_output_tokens = defaults.n * (defaults.max_tokens or llm.engine.max_model_len)
        self.metrics = RunMetrics()
        self.num_stop_requests = 0
        self.num_aborted = 0
        self.input_exhausted = False
        self._handled_stops = 0
        self._pending: dict[int, tuple[InputRecord, SamplingParams | PoolingParams]] = {}
        self._on_progress: Callable[[JobProgress], None] | None = None

    def stop(self) -> None:
        self.num_stop_requests += 1

    @property
    def num_done(self) -> int:
        return len(self.output.state.done) + self.writer.num_written

    def run(self, on_progress: Callable[[JobProgress], None] | None = None) -> JobResult:
        self.metrics = RunMetrics()
        self._on_progress = on_progress
        write_error = None
        cpus = allowed_cpus()
        cpu_start = sample_cpu(cpus)
        try:
            for result in self.llm.stream(self._requests(), on_step=self._on_step):
                record, params = self._pending.pop(int(result.request_id))
                self.metrics.observe_output(result)
                num_logprobs = getattr(params, "logprobs", None) or 0  # PoolingParams: none
                num_prompt_logprobs = getattr(params, "prompt_logprobs", None) or 0
                line = self.formatter.output(record, result, num_logprobs, num_prompt_logprobs)
                self.writer.put(int(result.request_id), line, record.line, result.error is not None)
        except OutputWriteError as e:
            write_error = e
            for request_id in list(self.engine.requests):
                self.engine.abort_request(request_id)
        except BaseException:  # a signal can strike in the middle of a write
            self.writer.cut_torn_record()
            raise
        self.metrics.end = time.perf_counter()
        if on_progress is not None:
            on_progress(self._progress())
        state = self.output.state
        failed_lines = sorted(state.failed_lines + self.writer.failed_lines)[:MAX_FAILED_LINES]
        summary = {
            "num_requests": self.num_done,
            "num_failed": state.num_failed + self.writer.num_failed,
            "num_resumed": len(state.done),
            **self.metrics.summary(self.engine),
            "others_busy_cpus": round(others_busy(cpu_start, sample_cpu(cpus)), 2),
            "num_cpus": len(cpus),
        }
        return JobResult(
            num_records=self.num_done,
            num_failed=summary["num_failed"],
            failed_lines=failed_lines,
            num_resumed=len(state.done),
            interrupted=self.num_stop_requests > 0
            and (not self.input_exhausted or self.num_aborted > 0),
            summary=summary,
            write_error=write_error,
        )

    def _requests(
        self,
    ) -> Iterator[tuple[str, list[int], SamplingParams | PoolingParams, LoRARequest | None]]:
        done = self.output.state.done
        first_line: dict[str, int] = {}
        indices = count()
        for record in self.source.records:
            if self.num_stop_requests:
                return
            first = first_line.setdefault(record.id, record.line)
            if record.line in done:
                continue
            index = next(indices)
            try:
                prompt, params = self.builder.prepare(record)
                lora = self.builder.lora_of(record)
                if first != record.line:
                    where = record.where_at(first)
                    raise RequestError(f"duplicate id {record.id!r} (first at {where})")
            except RequestError as e:
                self.writer.put(index, self.formatter.error(record, str(e)), record.line, True)
                continue
            self._pending[index] = (record, params)
            yield str(index), prompt, params, lora
        self.input_exhausted = True

    def _on_step(self, engine: LLMEngine) -> None:
        self.metrics.observe_step(engine)
        if self.num_stop_requests > self._handled_stops:
            self._handled_stops = self.num_stop_requests
            # Admission is in arrival order, so the started requests are a prefix of those
            # admitted; aborting the rest leaves the written records a prefix of the input.
            if self.num_stop_requests >= 2:
                aborted = list(engine.requests)
                for request_id in aborted:
                    engine.abort_request(request_id)
            else:
                aborted = engine.abort_unstarted_requests()
            for request_id in aborted:
                self._pending.pop(int(request_id), None)
            self.num_aborted += len(aborted)
        if self._on_progress is not None:
            self._on_progress(self._progress())

    def _progress(self) -> JobProgress:
        return JobProgress(
            self.num_done,
            self.source.total,
            self.metrics,
            self.engine,
            self.num_stop_requests,
            self.max_output_tokens,
        )
