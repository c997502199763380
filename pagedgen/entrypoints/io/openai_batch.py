"""The OpenAI batch format: request lines in, response lines out.

A request line is {"custom_id", "method": "POST", "url", "body"} where url is /v1/chat/completions
(body.messages), /v1/completions (body.prompt) or, for an embedding job, /v1/embeddings
(body.input: io/pooling.py); body.response_format ({"type": "json_schema",
"json_schema": {"schema"}} or {"type": "json_object"}) becomes structured_outputs. A response
line is {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}; a
request that fails has response null and error {"code", "message"}. The id, batch_req_<line>, is
what --resume matches lines by.
"""

import time
from typing import Any

from pagedgen.entrypoints.io.pooling import parse_embedding_body
from pagedgen.entrypoints.io.records import (
    CHAT_FIELDS,
    SAMPLING_FIELDS,
    InputRecord,
    chat_options,
    check_messages,
    check_prompt,
    json_type,
    misspelled_field,
    sampling_overrides,
)
from pagedgen.entrypoints.io.tools import Answer, text_messages
from pagedgen.outputs import PositionLogprobs, RequestOutput

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",  # io/pooling.py: for --runner pooling
}
_RENAMED = ("max_tokens", "max_completion_tokens", "logprobs", "top_logprobs")
# Body parameters that would change what the answer means, and the values of each that do not
# (its defaults): any other value fails the request rather than being dropped unseen. Fields
# that only label a request (model, user, metadata, store, service_tier) are ignored.
_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "stream": (None, False),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}
# Every body field read or knowingly ignored: a near miss of one fails its request, as a
# native line's does
BODY_FIELDS = [
    "messages", "prompt", "input", "model", "user", "metadata", "store", "service_tier",
    "response_format", "encoding_format", "dimensions", "truncate_prompt_tokens", "use_activation",
    *SAMPLING_FIELDS, *_RENAMED, *_UNSUPPORTED, *CHAT_FIELDS,
]  # fmt: skip


def is_openai_request(obj: object) -> bool:
    return isinstance(obj, dict) and ("custom_id" in obj or "body" in obj)


def parse_openai(obj: object, line: int) -> InputRecord:
    if not isinstance(obj, dict):
        error = f"a line must be a JSON object, got {json_type(obj)}"
        return InputRecord(line, f"line-{line}", error=error)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        error = f"'custom_id' must be a non-empty string, got {json_type(custom_id)}"
        return InputRecord(line, f"line-{line}", error=error)
    record = InputRecord(line, custom_id)
    method, url, body = obj.get("method", "POST"), obj.get("url"), obj.get("body")
    if method != "POST":
        return record._replace(error=f"'method' must be POST, got {method!r}")
    if url not in ENDPOINTS:
        return record._replace(error=f"'url' must be one of {sorted(ENDPOINTS)}, got {url!r}")
    record = record._replace(endpoint=ENDPOINTS[url])
    if not isinstance(body, dict):
        return record._replace(error=f"'body' must be an object, got {json_type(body)}")
    if isinstance(body.get("model"), str):
        record = record._replace(model=body["model"])
    misspelled = misspelled_field(body, BODY_FIELDS)
    if misspelled is not None:
        return record._replace(error=f"{misspelled} (in 'body')")
    if record.endpoint == "embeddings":
        return parse_embedding_body(record, body)
    if record.endpoint == "chat":
        messages = text_messages(body.get("messages"))
        error = check_messages(messages)
        record = record._replace(messages=messages)
    else:
        prompt = body.get("prompt")
        error = check_prompt(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            error = "a list of prompts is not supported; write one request per prompt"
        record = record._replace(prompt=prompt)
    unsupported = [k for k, fine in _UNSUPPORTED.items() if k in body and body[k] not in fine]
    if error is None and unsupported:
        error = f"'{unsupported[0]}' is not supported (got {json_type(body[unsupported[0]])})"
    if error is None:
        sampling, error = _sampling(body, record.endpoint)
        record = record._replace(sampling=sampling)
    if error is None:
        chat, error = chat_options(body, record.endpoint == "chat")
        record = record._replace(chat=chat)
    return record._replace(error=error) if error else record


def _sampling(body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], str | None]:
    plain = {k: v for k, v in body.items() if k in SAMPLING_FIELDS and k not in _RENAMED}
    renamed = {"max_tokens": body.get("max_completion_tokens", body.get("max_tokens"))}
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if endpoint == "chat":
        if logprobs is not None and not isinstance(logprobs, bool):
            return {}, f"'logprobs' must be a boolean for chat, got {json_type(logprobs)}"
        renamed["logprobs"] = (top or 0) if logprobs else None
        if top is not None and not isinstance(top, int):
            return {}, f"'top_logprobs' must be an integer, got {json_type(top)}"
    else:
        renamed["logprobs"] = logprobs
    if body.get("response_format") is not None:
        if "structured_outputs" in plain:
            return {}, "give one of 'response_format' and 'structured_outputs', not both"
        plain["structured_outputs"], error = _response_format(body["response_format"])
        if error is not None:
            return {}, error
    overrides, error = sampling_overrides({**plain, **renamed})
    overrides = {k: v for k, v in overrides.items() if k not in renamed or v is not None}
    return overrides, error


def _response_format(value: object) -> tuple[dict[str, Any] | None, str | None]:
    """OpenAI's response_format as structured_outputs fields; "text" is no constraint."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None, None
    if kind == "json_object":
        return {"json_object": True}, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return {"json": schema}, None
        return (
            None,
            f"'response_format.json_schema.schema' must be an object, got {json_type(schema)}",
        )
    return None, (
        "'response_format' must be an object with 'type' text, json_object or json_schema, "
        f"got {json_type(value if kind is None else kind)}"
    )


def openai_response(
    record: InputRecord,
    output: RequestOutput,
    top_logprobs: int,
    model: str,
    tokenizer: Any,
    answers: list[Answer] | None = None,
) -> dict[str, Any]:
    """The response line for a request that ran (output.error is None); with answers (chat
    answers as the parsers read them), a message holds the content, the reasoning_content and
    the tool_calls (finish_reason "tool_calls" where there are some), as vLLM's server writes
    them."""
    chat = record.endpoint == "chat"
    choices = []
    for i, completion in enumerate(output.outputs):
        logprobs = None
        if completion.logprobs:
            steps = list(zip(completion.token_ids, completion.logprobs))
            logprobs = (_chat_logprobs if chat else _completion_logprobs)(
                steps, top_logprobs, tokenizer
            )
        choice: dict[str, Any] = {"index": completion.index}
        finish_reason = completion.finish_reason
        if chat and answers:
            answer = answers[i]
            message = {"role": "assistant", "content": answer.content}
            message["reasoning_content"] = answer.reasoning
            if answer.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": f"chatcmpl-tool-{record.line}-{i}-{k}",  # deterministic
                        "type": "function",
                        "function": call,
                    }
                    for k, call in enumerate(answer.tool_calls)
                ]
                finish_reason = "tool_calls"
            choice["message"] = message
        elif chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = completion.text
        choice.update(logprobs=logprobs, finish_reason=finish_reason)
        choices.append(choice)
    usage = {
        "prompt_tokens": output.num_prompt_tokens,
        "completion_tokens": output.num_output_tokens,
        "total_tokens": output.num_prompt_tokens + output.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": output.num_cached_tokens},
    }
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{record.line}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
    return openai_success(record, body)


def openai_success(record: InputRecord, body: dict[str, Any]) -> dict[str, Any]:
    """The response line of a request that ran, around its response body."""
    response = {"status_code": 200, "request_id": f"req_{record.line}", "body": body}
    return {
        "id": batch_id(record.line),
        "custom_id": record.id,
        "response": response,
        "error": None,
    }


def openai_error(record: InputRecord, message: str) -> dict[str, Any]:
    custom_id = None if record.id == f"line-{record.line}" else record.id
    error = {"code": "invalid_request", "message": message}
    return {"id": batch_id(record.line), "custom_id": custom_id, "response": None, "error": error}


def batch_id(line: int) -> str:
    return f"batch_req_{line}"


def line_of_batch_id(value: object) -> int | None:
    if isinstance(value, str) and value.startswith("batch_req_") and value[10:].isdigit():
        return int(value[10:])
    return None


def _entry(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    token = tokenizer.decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _top(step: PositionLogprobs, k: int) -> list[tuple[int, float]]:
    ranked = sorted(step.items(), key=lambda item: -item[1].logprob)[:k]
    return [(token_id, lp.logprob) for token_id, lp in ranked]


def _chat_logprobs(
    steps: list[tuple[int, PositionLogprobs]], k: int, tokenizer: Any
) -> dict[str, Any]:
    content = []
    for token_id, step in steps:
        entry = _entry(tokenizer, token_id, step[token_id].logprob)
        entry["top_logprobs"] = [_entry(tokenizer, t, lp) for t, lp in _top(step, k)]
        content.append(entry)
    return {"content": content}


def _completion_logprobs(
    steps: list[tuple[int, PositionLogprobs]], k: int, tokenizer: Any
) -> dict[str, Any]:
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = 0
    for token_id, step in steps:
        token = tokenizer.decode([token_id])
        tokens.append(token)
        token_logprobs.append(step[token_id].logprob)
        top_logprobs.append({tokenizer.decode([t]): lp for t, lp in _top(step, k)})
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }
