"""Pooling results as lines (embeddings and classifications), and OpenAI's /v1/embeddings batch
requests (vLLM's run_batch takes them in the chat endpoints' format).

A native result line is {"id", "line", "embedding" | "probs": [floats], "prompt_tokens",
"latency", "error": null}, with the same keys on a line that failed (null where unknown); an
OpenAI response body is {"object": "list", "data": [{"object": "embedding", "index": 0,
"embedding"}], "model", "usage"}.
"""

import time
from typing import Any

from pagedgen.entrypoints.io.records import InputRecord, check_prompt, json_type, sampling_overrides
from pagedgen.outputs import EmbeddingRequestOutput, PoolingRequestOutput

RESULT_KEYS = {"embed": "embedding", "classify": "probs"}  # by pooling task


def parse_embedding_body(record: InputRecord, body: dict[str, Any]) -> InputRecord:
    """An OpenAI /v1/embeddings body: one input (a string or token ids, or a list of one of
    those), dimensions and vLLM's truncate_prompt_tokens and use_activation."""
    prompt = body.get("input")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    error = check_prompt(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        error = "a list of inputs is not supported; write one request per input"
    elif error is not None:
        error = error.replace("'prompt'", "'input'")
    encoding = body.get("encoding_format")
    if error is None and encoding not in (None, "float"):
        error = f"'encoding_format' must be \"float\", got {json_type(encoding)}"
    fields = {
        k: body[k] for k in ("dimensions", "truncate_prompt_tokens", "use_activation") if k in body
    }
    sampling, field_error = sampling_overrides(fields)
    record = record._replace(prompt=prompt, sampling=sampling)
    return record._replace(error=error or field_error)


def pooling_record(record: InputRecord, output: PoolingRequestOutput) -> dict[str, Any]:
    latency = output.metrics.latency
    if isinstance(output, EmbeddingRequestOutput):
        key, values = RESULT_KEYS["embed"], output.outputs.embedding
    else:
        key, values = RESULT_KEYS["classify"], output.outputs.probs
    return {
        "id": record.id,
        "line": record.line,
        key: values,
        "prompt_tokens": output.num_prompt_tokens,
        "latency": round(latency, 4) if latency is not None else None,
        "error": None,
    }


def pooling_error_record(
    record: InputRecord, task: str, reason: str, num_prompt_tokens: int = 0
) -> dict[str, Any]:
    return {
        "id": record.id,
        "line": record.line,
        RESULT_KEYS[task]: None,
        "prompt_tokens": num_prompt_tokens,
        "latency": None,
        "error": f"{record.where}: {reason}",
    }


def openai_embedding_body(output: EmbeddingRequestOutput, model: str, line: int) -> dict:
    num_tokens = output.num_prompt_tokens
    return {
        "id": f"embd-{line}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": 0, "object": "embedding", "embedding": output.outputs.embedding}],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
