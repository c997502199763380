import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, TextIO


class PromptRecord(NamedTuple):
    """One input line: a prompt (text or token ids) or chat messages, or why it is unusable."""

    line_number: int
    id: str
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    error: str | None = None


def open_input(path: str) -> TextIO:
    if path == "-":
        return sys.stdin
    if not Path(path).is_file():
        raise FileNotFoundError(f"input file {path!r} not found")
    return open(path, encoding="utf-8", errors="replace")


def read_jsonl(stream: TextIO) -> Iterator[PromptRecord]:
    """Parses lines lazily; a bad line becomes a record with an error instead of stopping."""
    for line_number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        default_id = f"line-{line_number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield PromptRecord(line_number, default_id, error=f"invalid JSON: {e}")
            continue
        yield parse_record(obj, line_number, default_id)


def parse_record(obj: object, line_number: int, default_id: str) -> PromptRecord:
    if not isinstance(obj, dict):
        return PromptRecord(line_number, default_id, error="a line must be a JSON object")
    record_id = str(obj.get("id", default_id))
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if (prompt is None) == (messages is None):
        error = "a line needs exactly one of 'prompt' and 'messages'"
        return PromptRecord(line_number, record_id, error=error)
    if prompt is not None:
        is_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if not (isinstance(prompt, str) or is_ids) or not prompt:
            error = "'prompt' must be a non-empty string or list of token ids"
            return PromptRecord(line_number, record_id, error=error)
        return PromptRecord(line_number, record_id, prompt=prompt)
    valid = (
        isinstance(messages, list)
        and messages
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    )
    if not valid:
        error = "'messages' must be a non-empty list of {role, content} string objects"
        return PromptRecord(line_number, record_id, error=error)
    return PromptRecord(line_number, record_id, messages=messages)
