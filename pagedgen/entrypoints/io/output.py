from collections.abc import Callable
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
from pagedgen.outputs import (
    CompletionOutput,
    Logprob,
    PoolingRequestOutput,
    PositionLogprobs,
    RequestOutput,
)

TokenText = Callable[[int], str | None]


def output_record(
    record: InputRecord,
    output: RequestOutput,
    answers: list[Answer] | None = None,
    num_logprobs: int = 0,
    num_prompt_logprobs: int = 0,
    token_text: TokenText = lambda token_id: None,
) -> dict[str, Any]:
    """The JSON line of a finished request, with the keys of every record (see _record), each of
    one type whatever n: text, finish_reason, reasoning and tool_calls are the first
    completion's; outputs holds every completion, as vLLM's RequestOutput.outputs. With answers
    (chat answers read by the reasoning and tool call parsers), a completion's text is its
    content, beside its reasoning and tool_calls."""
    completions = []
    for i, c in enumerate(output.outputs):
        answer = answers[i] if answers else None
        logprobs = None
        if c.logprobs:
            logprobs = logprob_positions(c.token_ids, c.logprobs, num_logprobs, token_text)
        completions.append(
            {
                "index": c.index,
                "text": c.text if answer is None else answer.content,
                "finish_reason": c.finish_reason,
                "reasoning": None if answer is None else answer.reasoning,
                "tool_calls": None if answer is None else answer.tool_calls,
                "logprobs": logprobs,
            }
        )
    result = _record(record, output.num_prompt_tokens, error=None)
    for key in ("text", "finish_reason", "reasoning", "tool_calls"):
        result[key] = completions[0][key]
    result["outputs"] = completions
    result["completion_tokens"] = output.num_output_tokens
    if output.prompt_logprobs is not None:
        result["prompt_logprobs"] = logprob_positions(
            output.prompt_token_ids, output.prompt_logprobs, num_prompt_logprobs, token_text
        )
    metrics = output.metrics
    ttft = metrics.time_to_first_token
    result["time_to_first_token"] = round(ttft, 4) if ttft is not None else None
    result["latency"] = round(metrics.latency, 4) if metrics.latency is not None else None
    if output.lora_request is not None:
        result["lora"] = output.lora_request.lora_name
    return result


def error_record(record: InputRecord, reason: str, num_prompt_tokens: int = 0) -> dict[str, Any]:
    """The line of a request that could not run; the error names where it is in the input."""
    return _record(record, num_prompt_tokens, error=f"{record.where}: {reason}")


def _record(record: InputRecord, num_prompt_tokens: int, error: str | None) -> dict[str, Any]:
    """Every key of a generation record, success or error, null (or empty, or 0) until known."""
    return {
        "id": record.id,
        "line": record.line,
        "text": None,
        "finish_reason": "error",
        "reasoning": None,
        "tool_calls": None,
        "outputs": [],
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": 0,
        "prompt_logprobs": None,
        "time_to_first_token": None,
        "latency": None,
        "lora": None,
        "error": error,
    }


def logprob_positions(
    token_ids: list[int],
    steps: list[PositionLogprobs | None],
    k: int,
    token_text: TokenText = lambda token_id: None,
) -> list[dict[str, Any] | None]:
    """The engine's logprobs as vLLM gives them, one entry per position: the chosen token's
    token_id, token (its text), logprob and rank (from 1, in the whole vocabulary), and
    top_logprobs, the k likeliest tokens (each with the same fields), highest first. A step
    holds the chosen token's Logprob, then the k likeliest: k entries when the chosen token is
    among them, k + 1 when not."""
    positions = []
    for token_id, step in zip(token_ids, steps):
        if step is None:
            positions.append(None)
            continue
        top = sorted(step.items(), key=lambda item: -item[1].logprob)
        if len(step) > k:  # the chosen token is not among the k likeliest
            top = [item for item in top if item[0] != token_id]

        def entry(t: int, lp: Logprob) -> dict[str, Any]:
            return {"token_id": t, "token": token_text(t), "logprob": lp.logprob, "rank": lp.rank}

        positions.append(
            {
                **entry(token_id, step[token_id]),
                "top_logprobs": [entry(t, lp) for t, lp in top[:k]],
            }
        )
    return positions


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
        self._token_texts: dict[int, str] = {}

    def output(
        self,
        record: InputRecord,
        output: RequestOutput | PoolingRequestOutput,
        num_logprobs: int,
        num_prompt_logprobs: int = 0,
    ) -> dict:
        """num_logprobs and num_prompt_logprobs: the request's SamplingParams logprobs and
        prompt_logprobs (0 where None)."""
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
            line = output_record(
                record, output, answers, num_logprobs, num_prompt_logprobs, self._token_text
            )
        return {**line, "request_hash": request_hash(record)}

    def _text(self, completion: CompletionOutput) -> str:
        """The completion's text as the parsers read it: with its special tokens for harmony
        (gpt-oss), whose message markers are special tokens the text drops."""
        if self.tokenizer is None or not uses_harmony(*self.parsers):
            return completion.text
        return self.tokenizer.decode(completion.token_ids, skip_special_tokens=False)

    def _token_text(self, token_id: int) -> str | None:
        """A token's text as vLLM's logprobs give it (decoded alone); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

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
