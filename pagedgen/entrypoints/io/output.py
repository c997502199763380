from typing import Any

from pagedgen.entrypoints.io.harmony import uses_harmony
from pagedgen.entrypoints.io.openai_batch import openai_error, openai_response, openai_success
from pagedgen.entrypoints.io.pooling import (
    openai_embedding_body,
    pooling_error_record,
    pooling_record,
)
from pagedgen.entrypoints.io.records import InputRecord, request_hash
from pagedgen.entrypoints.io.tools import Answer, forces_tool_calls, read_answer
from pagedgen.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput


def output_record(
    record: InputRecord, output: RequestOutput, answers: list[Answer] | None = None
) -> dict[str, Any]:
    """The JSON line of a finished request: text (a list when n > 1), finish_reason, token counts,
    seconds to the first token and in all, logprobs and prompt logprobs when asked for, and the
    LoRA adapter's name if it ran with one. With answers (chat answers read by the reasoning
    and tool call parsers), text is each one's content, beside its "reasoning" and
    "tool_calls"."""
    completions = output.outputs
    single = len(completions) == 1
    texts = [c.text for c in completions] if not answers else [a.content for a in answers]
    result: dict[str, Any] = {
        "id": record.id,
        "line": record.line,
        "text": texts[0] if single else texts,
        "finish_reason": completions[0].finish_reason
        if single
        else [c.finish_reason for c in completions],
        "prompt_tokens": output.num_prompt_tokens,
        "completion_tokens": output.num_output_tokens,
    }
    if answers:
        for field in ("reasoning", "tool_calls"):
            values = [getattr(a, field) for a in answers]
            result[field] = values[0] if single else values
    if any(c.logprobs for c in completions):
        result["logprobs"] = [
            [{str(t): lp for t, lp in step.items()} for step in c.logprobs or []]
            for c in completions
        ]
    if output.prompt_logprobs is not None:
        result["prompt_logprobs"] = [
            None if step is None else {str(t): lp for t, lp in step.items()}
            for step in output.prompt_logprobs
        ]
    metrics = output.metrics
    ttft = metrics.time_to_first_token
    result["time_to_first_token"] = round(ttft, 4) if ttft is not None else None
    result["latency"] = round(metrics.latency, 4) if metrics.latency is not None else None
    if output.lora_request is not None:
        result["lora"] = output.lora_request.lora_name
    result["error"] = None
    return result


def error_record(record: InputRecord, reason: str, num_prompt_tokens: int = 0) -> dict[str, Any]:
    """The line of a request that could not run; the error names where it is in the input."""
    return {
        "id": record.id,
        "line": record.line,
        "text": None,
        "finish_reason": "error",
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": 0,
        "error": f"{record.where}: {reason}",
    }


class RecordFormatter:
    """Turns finished requests and failures into output lines, pagedgen's or OpenAI's; each line
    ends with its request's hash, which --resume checks. A pooling job's lines hold embeddings or
    class scores (io/pooling.py)."""

    def __init__(
        self,
        openai: bool,
        model: str = "",
        tokenizer: Any = None,
        reasoning_parser: str | None = None,  # splits chat answers (see io/reasoning.py)
        tool_call_parser: str | None = None,  # reads their tool calls (see io/tools.py)
        pooling: str | None = None,  # a pooling job's task: embed or classify
    ) -> None:
        self.openai = openai
        self.pooling = pooling
        self.model = model
        self.tokenizer = tokenizer
        self.parsers = (reasoning_parser, tool_call_parser)

    def output(
        self, record: InputRecord, output: RequestOutput | PoolingRequestOutput, num_logprobs: int
    ) -> dict:
        if output.error is not None:
            return self.error(record, output.error, output.num_prompt_tokens)
        if isinstance(output, PoolingRequestOutput):
            return {**self._pooling(record, output), "request_hash": request_hash(record)}
        answers = []
        parsed = forces_tool_calls(record.chat) or self.parsers != (None, None)
        if record.messages is not None and parsed:
            answers = [
                read_answer(self._text(c), *self.parsers, record.chat) for c in output.outputs
            ]
        if self.openai:  # as vLLM, the model of a response is the adapter's name if it ran one
            lora = output.lora_request
            model = self.model if lora is None else lora.lora_name
            line = openai_response(record, output, num_logprobs, model, self.tokenizer, answers)
        else:
            line = output_record(record, output, answers)
        return {**line, "request_hash": request_hash(record)}

    def _text(self, completion: CompletionOutput) -> str:
        """The completion's text as the parsers read it: with its special tokens for harmony
        (gpt-oss), whose message markers are special tokens the text drops."""
        if self.tokenizer is None or not uses_harmony(*self.parsers):
            return completion.text
        return self.tokenizer.decode(completion.token_ids, skip_special_tokens=False)

    def error(self, record: InputRecord, reason: str, num_prompt_tokens: int = 0) -> dict:
        if self.openai:
            line = openai_error(record, f"{record.where}: {reason}")
        elif self.pooling is not None:
            line = pooling_error_record(record, self.pooling, reason, num_prompt_tokens)
        else:
            line = error_record(record, reason, num_prompt_tokens)
        return {**line, "request_hash": request_hash(record)}

    def _pooling(self, record: InputRecord, output: PoolingRequestOutput) -> dict:
        if not self.openai:
            return pooling_record(record, output)
        return openai_success(record, openai_embedding_body(output, self.model, record.line))
