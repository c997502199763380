import json
from typing import TextIO

from pagedgen.outputs import RequestOutput


def output_record(record_id: str, output: RequestOutput) -> dict:
    """The JSON line written for one finished request."""
    completions = output.outputs
    record = {
        "id": record_id,
        "text": completions[0].text if len(completions) == 1 else [c.text for c in completions],
        "finish_reason": completions[0].finish_reason
        if len(completions) == 1
        else [c.finish_reason for c in completions],
        "prompt_tokens": output.num_prompt_tokens,
        "completion_tokens": output.num_output_tokens,
        "error": output.error,
    }
    if any(c.logprobs for c in completions):
        record["logprobs"] = [
            [{str(t): lp for t, lp in step.items()} for step in c.logprobs or []]
            for c in completions
        ]
    metrics = output.metrics
    if metrics.latency is not None:
        ttft = metrics.time_to_first_token
        record["time_to_first_token"] = round(ttft, 4) if ttft is not None else None
        record["latency"] = round(metrics.latency, 4)
    return record


def error_record(record_id: str, line_number: int, error: str) -> dict:
    return {"id": record_id, "error": f"line {line_number}: {error}", "finish_reason": "error"}


class OrderedWriter:
    """Writes records in input order as soon as every earlier one is done: one write and a
    flush per line, so a reader (or a crash) never sees half a record."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.pending: dict[int, dict] = {}
        self.next_index = 0
        self.num_written = 0
        self.num_failed = 0

    def put(self, index: int, record: dict) -> None:
        self.pending[index] = record
        while self.next_index in self.pending:
            record = self.pending.pop(self.next_index)
            self.stream.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.stream.flush()
            self.next_index += 1
            self.num_written += 1
            self.num_failed += record.get("error") is not None
