"""One replica of a Ray job: a Ray Data actor holding one LLM, completing the rows of each batch
it is given with the same request building and record formatting as `pagedgen run`."""

import json
import os
import socket
import time
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from pagedgen.entrypoints.batch.requests import RequestBuilder, RequestError, vocab_size_of
from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.io.output import RecordFormatter
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.lora_modules import lora_requests
from pagedgen.entrypoints.ray.config import ProcessorConfig

RECORD = "record"  # the column of a job's rows: an InputRecord as JSON, in; its output line, out
INDEX = "index"  # the job's consecutive index of a row, passed through
REPLICA = "replica"  # host:pid of the replica that made a record
BUSY_S = "busy_s"  # the replica's seconds on the row's batch, shared out over its rows


def encode_record(record: InputRecord) -> str:
    return json.dumps(record._replace(reference=None)._asdict())


def decode_record(text: str) -> InputRecord:
    return InputRecord(**json.loads(text))


class LLMReplica:
    """Completes batches of rows: each row of a job carries an encoded InputRecord and gets back
    its output line; a row that cannot run gets its error line. Rows never fail a batch: even an
    engine failure becomes the error line of every row it left unfinished."""

    config: ProcessorConfig  # set on the subclass that map_replicas hands to Ray Data

    def __init__(self) -> None:
        from pagedgen import LLM

        config = self.config
        engine = config.engine_config  # num_threads: the CPUs Ray gave the replica
        self.llm = LLM(log=lambda message: None, **asdict(engine))
        pooler_config = self.llm.engine.pooler_config
        task = pooler_config.task if pooler_config is not None else None  # a pooling job's
        self.builder = RequestBuilder(
            self.llm.tokenizer,
            config.sampling,
            vocab_size_of(self.llm.engine),
            engine.max_num_seqs,
            self.llm.engine.max_model_len,
            lora_requests(config.lora_modules),
            ChatTemplate(config.chat_template, config.chat_template_kwargs),
            config.tool_call_parser,
            task,
        )
        self.formatter = RecordFormatter(
            config.openai,
            engine.model,
            self.llm.tokenizer,
            engine.reasoning_parser,
            config.tool_call_parser,
            task,
        )
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: pa.Table) -> pa.Table:
        start = time.perf_counter()
        records = [decode_record(text) for text in batch.column(RECORD).to_pylist()]
        lines = self.complete(records)
        busy_s = (time.perf_counter() - start) / max(len(lines), 1)
        return pa.table(
            {
                INDEX: batch.column(INDEX),
                RECORD: [json.dumps(line, ensure_ascii=False) for line in lines],
                REPLICA: [self.name] * len(lines),
                BUSY_S: [busy_s] * len(lines),
            }
        )

    def complete(self, records: list[InputRecord]) -> list[dict[str, Any]]:
        """The output line of each record, in order."""
        lines: list[dict[str, Any] | None] = [None] * len(records)
        requests = []
        logprobs: dict[int, tuple[int, int]] = {}  # logprobs, prompt_logprobs
        for i, record in enumerate(records):
            try:
                prompt, params = self.builder.prepare(record)
                lora = self.builder.lora_of(record)
            except RequestError as e:
                lines[i] = self.formatter.error(record, str(e))
                continue
            logprobs[i] = (  # PoolingParams: none
                getattr(params, "logprobs", None) or 0,
                getattr(params, "prompt_logprobs", None) or 0,
            )
            requests.append((str(i), prompt, params, lora))
        try:
            for output in self.llm.stream(requests):
                i = int(output.request_id)
                lines[i] = self.formatter.output(records[i], output, *logprobs[i])
        except Exception as e:  # an engine failure fails its unfinished rows, not the job
            for request_id in list(self.llm.engine.requests):
                self.llm.engine.abort_request(request_id)
            for i, line in enumerate(lines):
                if line is None:
                    lines[i] = self.formatter.error(records[i], f"engine error: {e}")
        return lines  # type: ignore[return-value]
