"""A batch job on Ray Data: `pagedgen run --ray`, and the same from Python.

The driver reads the input with pagedgen's readers (so lines, ids, errors and request hashes
are those of a local run), hands the records missing from the output to the replicas, and
writes each record that comes back through the same writer as a local run: one whole line each,
in input order (or as they finish), into an output that --resume continues.
"""

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pyarrow as pa

from pagedgen.entrypoints.batch.job import ORDERS, JobResult
from pagedgen.entrypoints.io.output import RecordFormatter
from pagedgen.entrypoints.io.readers import InputSource
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.resume import ResumeState, record_line, resume_source
from pagedgen.entrypoints.io.writer import MAX_FAILED_LINES, OutputWriteError, RecordWriter
from pagedgen.entrypoints.ray.config import ProcessorConfig, require_ray
from pagedgen.entrypoints.ray.processor import map_replicas
from pagedgen.entrypoints.ray.replica import (
    BUSY_S,
    INDEX,
    RECORD,
    REPLICA,
    LLMReplica,
    encode_record,
)
from pagedgen.entrypoints.ray.stats import RayMetrics, RayProgress
from pagedgen.loader import ModelNotFoundError, resolve_model
from pagedgen.pooling.config import job_task

WAIT_FOR_REPLICAS_S = 600


class Output(Protocol):
    """An OutputFile, or a PartsOutput folder."""

    path: str
    state: ResumeState

    @property
    def stream(self) -> Any: ...


class RayJob:
    """Runs every record of an input through the replicas of a Ray cluster and writes one output
    line for each, exactly once: a replica that dies has its batches retried (by Ray Data) and a
    record that comes back twice is written once. stop() ends the job at the next batch back;
    the records written are whole and --resume runs the rest.
    """

    def __init__(
        self,
        config: ProcessorConfig,
        source: InputSource,
        output: Output,
        order: str = "input",
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.config = config
        self.source = resume_source(source, output.state, output.path)
        self.output = output
        self.writer = RecordWriter(output.stream, ordered=order == "input")
        self.formatter = RecordFormatter(
            source.is_openai, config.model, pooling=_pooling_task(config)
        )
        self.metrics = RayMetrics()
        self.num_stop_requests = 0

    def stop(self) -> None:
        self.num_stop_requests += 1

    @property
    def num_done(self) -> int:
        return len(self.output.state.done) + self.writer.num_written

    def run(self, on_progress: Callable[[RayProgress], None] | None = None) -> JobResult:
        self.metrics = RayMetrics()
        rows = self._rows()
        returned: set[int] = set()
        write_error = None
        try:
            for batch in self._results(rows):
                self._write(batch, returned)
                if on_progress is not None:
                    on_progress(self._progress())
                if self.num_stop_requests:
                    break
        except OutputWriteError as e:
            write_error = e
        except BaseException:
            self.writer.cut_torn_record()
            raise
        self.metrics.end = time.perf_counter()
        stopped = self.num_stop_requests > 0 or write_error is not None
        if not stopped and len(returned) != len(rows):
            raise RuntimeError(f"Ray Data returned {len(returned)} of {len(rows)} records")
        if on_progress is not None:
            on_progress(self._progress())
        return self._result(write_error, interrupted=len(returned) < len(rows) and stopped)

    def _rows(self) -> list[tuple[int, str]]:
        """(index, encoded record) of each record to run; duplicate ids are written as errors
        at once, as a local run does."""
        done = self.output.state.done
        first_line: dict[str, int] = {}
        rows = []
        for index, record in enumerate(self._missing(done, first_line)):
            first = first_line[record.id]
            if first != record.line:
                reason = f"duplicate id {record.id!r} (first at {record.where_at(first)})"
                self.writer.put(index, self.formatter.error(record, reason), record.line, True)
            else:
                rows.append((index, encode_record(record)))
        return rows

    def _missing(self, done: dict[int, Any], first_line: dict[str, int]) -> Iterator[InputRecord]:
        for record in self.source.records:
            first_line.setdefault(record.id, record.line)
            if record.line not in done:
                yield record

    def _results(self, rows: list[tuple[int, str]]) -> Iterator[pa.Table]:
        if not rows:
            return
        ray = require_ray()
        context = ray.data.DataContext.get_current()
        if getattr(context, "wait_for_min_actors_s", 1) <= 0:  # every replica loads first
            context.wait_for_min_actors_s = WAIT_FOR_REPLICAS_S
        size = self.config.batch_size
        tables = [
            pa.table({INDEX: [i for i, _ in chunk], RECORD: [r for _, r in chunk]})
            for chunk in (rows[start : start + size] for start in range(0, len(rows), size))
        ]
        ds = map_replicas(ray.data.from_arrow(tables), self.config, LLMReplica)
        yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")

    def _write(self, batch: pa.Table, returned: set[int]) -> None:
        columns = [batch.column(name).to_pylist() for name in (INDEX, RECORD, REPLICA, BUSY_S)]
        for index, text, replica, busy_s in zip(*columns):
            if index in returned:
                self.metrics.num_duplicates += 1
                continue
            returned.add(index)
            line = json.loads(text)
            self.metrics.observe(replica, line, busy_s)
            failed = line.get("error") is not None
            self.writer.put(index, line, _line_of(line), failed)

    def _progress(self) -> RayProgress:
        return RayProgress(self.num_done, self.source.total, self.metrics, self.num_stop_requests)

    def _result(self, write_error: OutputWriteError | None, interrupted: bool) -> JobResult:
        state = self.output.state
        failed_lines = sorted(state.failed_lines + self.writer.failed_lines)[:MAX_FAILED_LINES]
        num_failed = state.num_failed + self.writer.num_failed
        summary = {
            "num_requests": self.num_done,
            "num_failed": num_failed,
            "num_resumed": len(state.done),
            **self.metrics.summary(),
        }
        return JobResult(
            num_records=self.num_done,
            num_failed=num_failed,
            failed_lines=failed_lines,
            num_resumed=len(state.done),
            interrupted=interrupted,
            summary=summary,
            write_error=write_error,
        )


def _line_of(line: dict[str, Any]) -> int:
    number = record_line(line)
    assert number is not None, line
    return number


def _pooling_task(config: ProcessorConfig) -> str | None:
    """The replicas' pooling task, for the error lines the driver writes (a model only the
    replicas can find: theirs say)."""
    try:
        engine = config.engine_config
        return job_task(
            engine.runner,
            resolve_model(config.model, engine.download_dir, engine.revision).path,
            engine.hf_overrides,
        )
    except ModelNotFoundError:
        return None
