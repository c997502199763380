import difflib
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedgen.entrypoints.io.tools import check_tools, text_messages

Prompt = str | list[int]
Messages = list[dict[str, str]]

_FLOAT = "float"
_INT = "int"
_OPTIONAL_INT = "int or null"
_BOOL = "bool"
_OPTIONAL_BOOL = "bool or null"
_STRINGS = "string or list of strings"
_TOKEN_IDS = "list of token ids"
_OPTIONAL_TOKEN_IDS = "list of token ids or null"
_OPTIONAL_OBJECT = "JSON object or null"
_TOOLS = "tools"

# The SamplingParams fields an input line may set for itself, and the JSON type each takes.
SAMPLING_FIELDS = {
    "n": _INT,
    "temperature": _FLOAT,
    "top_p": _FLOAT,
    "top_k": _INT,
    "min_p": _FLOAT,
    "presence_penalty": _FLOAT,
    "frequency_penalty": _FLOAT,
    "repetition_penalty": _FLOAT,
    "seed": _OPTIONAL_INT,
    "max_tokens": _OPTIONAL_INT,
    "min_tokens": _INT,
    "stop": _STRINGS,
    "stop_token_ids": _TOKEN_IDS,
    "ignore_eos": _BOOL,
    "logprobs": _OPTIONAL_INT,
    "prompt_logprobs": _OPTIONAL_INT,
    "logit_bias": _OPTIONAL_OBJECT,  # {token id (a string in JSON): bias}
    "truncate_prompt_tokens": _OPTIONAL_INT,
    "allowed_token_ids": _OPTIONAL_TOKEN_IDS,
    "bad_words": _STRINGS,
    "include_stop_str_in_output": _BOOL,
    "skip_special_tokens": _BOOL,
    # StructuredOutputsParams' fields (json, regex, choice, grammar, json_object); null: none
    "structured_outputs": _OPTIONAL_OBJECT,
}
# The PoolingParams fields an embedding request may set (truncate_prompt_tokens is shared).
POOLING_FIELDS = {"dimensions": _OPTIONAL_INT, "use_activation": _OPTIONAL_BOOL}


class InputRecord(NamedTuple):
    """One input request: a prompt or chat messages, with its own sampling overrides.

    line is the 1-based position in the input (the line of a file, the row of a dataset); it is
    the key that --resume matches output records by. unit names positions in messages: line 7
    of a file, row 7 of a dataset. A record that cannot run carries error.
    """

    line: int
    id: str
    prompt: Prompt | None = None
    messages: Messages | None = None
    sampling: dict[str, Any] = {}
    error: str | None = None
    reference: Any = None  # a reference completion (text or token count) for profile
    endpoint: str | None = None  # "chat" or "completions" for OpenAI batch input
    unit: str = "line"  # what a position counts: lines, dataset rows, conversations, from 1
    lora: str | None = None  # the LoRA adapter (a --lora-modules name) the line asks for
    model: str | None = None  # an OpenAI body's model: a LoRA adapter where it names one
    chat: dict[str, Any] = {}  # CHAT_FIELDS the line sets, for its messages

    @property
    def where(self) -> str:
        return self.where_at(self.line)

    def where_at(self, line: int) -> str:
        return f"{self.unit} {line}"


def request_hash(record: InputRecord) -> str:
    """A short digest of what a record asks for. Every output record carries it, so that --resume
    can prove an existing output answers this input, line by line, whether lines have ids or not.
    """
    asked = [record.id, record.prompt, record.messages, record.sampling, record.endpoint]
    if record.lora is not None:  # only then: the digests of earlier outputs stay valid
        asked.append({"lora": record.lora})
    if record.chat:
        asked.append({"chat": record.chat})
    text = json.dumps([*asked, record.error], ensure_ascii=False, sort_keys=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _is_type(value: object, kind: str) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == _FLOAT:
        return is_int or isinstance(value, float)
    if kind == _INT:
        return is_int
    if kind == _OPTIONAL_INT:
        return value is None or is_int
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _OPTIONAL_BOOL:
        return value is None or isinstance(value, bool)
    if kind == _OPTIONAL_OBJECT:
        return value is None or isinstance(value, dict)
    if kind == _STRINGS:
        return isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(s, str) for s in value)
        )
    if kind == _OPTIONAL_TOKEN_IDS:
        return value is None or is_token_ids(value)
    return is_token_ids(value)


def sampling_overrides(obj: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Picks the sampling (and pooling) fields out of obj; returns them, or the first wrongly
    typed one."""
    overrides = {}
    for name, kind in (SAMPLING_FIELDS | POOLING_FIELDS).items():
        if name not in obj:
            continue
        value = obj[name]
        if not _is_type(value, kind):
            return {}, f"{name!r} must be a {kind}, got {json_type(value)}"
        if isinstance(value, float) and not math.isfinite(value):  # JSON's Infinity and NaN
            return {}, f"{name!r} must be a finite number, got {value}"
        overrides[name] = value
    return overrides, None


def check_prompt(prompt: object) -> str | None:
    if isinstance(prompt, str):
        return None if prompt else "the prompt is empty"
    if is_token_ids(prompt):
        return None if prompt else "the prompt is an empty list of token ids"
    return f"'prompt' must be a string or a list of token ids, got {json_type(prompt)}"


# How a line's messages become its prompt (vLLM's request fields), and the JSON type of each.
CHAT_FIELDS = {
    "add_generation_prompt": _BOOL,
    "continue_final_message": _BOOL,
    "chat_template_kwargs": _OPTIONAL_OBJECT,
    "tools": _TOOLS,  # checked by io/tools.py
    "tool_choice": _TOOLS,
}
# Every field a native line may carry; others are the line's own, ignored (unless misspelled)
NATIVE_FIELDS = ["id", "prompt", "messages", "lora", *SAMPLING_FIELDS, *POOLING_FIELDS,
                 *CHAT_FIELDS]  # fmt: skip
CHAT_DEFAULTS = {  # values that change nothing: a plain prompt may carry them
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template_kwargs": ({},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
}


def chat_options(obj: dict[str, Any], has_messages: bool) -> tuple[dict[str, Any], str | None]:
    """The CHAT_FIELDS obj sets; or the first wrongly typed one, or one beside a plain prompt."""
    options = {name: obj[name] for name in CHAT_FIELDS if obj.get(name) is not None}
    for name, value in options.items():
        kind = CHAT_FIELDS[name]
        if kind != _TOOLS and not _is_type(value, kind):
            return {}, f"{name!r} must be a {kind}, got {json_type(value)}"
        if not has_messages and value not in CHAT_DEFAULTS[name]:
            return {}, f"{name!r} applies to 'messages', not to a plain prompt"
    error = check_tools(options.get("tools"), options.get("tool_choice"))
    if error is not None:
        return {}, error
    if options.get("continue_final_message") and options.get("add_generation_prompt", True):
        return {}, "'continue_final_message' needs 'add_generation_prompt': false"
    return options, None


def check_messages(messages: object) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list, got {json_type(messages)}"
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            return f"messages[{i}] must be an object with string 'role' and 'content'"
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and message["role"] == "assistant"):
            return f"messages[{i}]: 'tool_calls' must be a list, in an assistant message"
        content = message.get("content")
        if isinstance(content, list):  # text_messages joined the lists of text parts
            return f"messages[{i}]: only text content parts are supported"
        if not (isinstance(content, str) or (content is None and calls)):
            return f"messages[{i}] must be an object with string 'role' and 'content'"
    return None


def parse_native(obj: object, line: int, unit: str = "line") -> InputRecord:
    """A pagedgen input object: {"prompt" | "messages", "id"?, sampling fields?}."""
    default_id = f"line-{line}"
    if not isinstance(obj, dict):
        error = f"a line must be a JSON object, got {json_type(obj)}"
        return InputRecord(line, default_id, error=error, unit=unit)
    record_id = obj.get("id", default_id)
    if not isinstance(record_id, str | int) or isinstance(record_id, bool):
        error = f"'id' must be a string or an integer, got {json_type(record_id)}"
        return InputRecord(line, default_id, error=error, unit=unit)
    record = InputRecord(line, str(record_id), unit=unit)
    misspelled = misspelled_field(obj)
    if misspelled is not None:
        return record._replace(error=misspelled)
    prompt, messages = obj.get("prompt"), text_messages(obj.get("messages"))
    if (prompt is None) == (messages is None):
        return record._replace(error="a line needs exactly one of 'prompt' and 'messages'")
    error = check_prompt(prompt) if prompt is not None else check_messages(messages)
    if error is None:
        overrides, error = sampling_overrides(obj)
    if error is None:
        chat, error = chat_options(obj, messages is not None)
    lora = obj.get("lora")
    if error is None and lora is not None and not (isinstance(lora, str) and lora):
        error = f"'lora' must be the name of a LoRA adapter, got {json_type(lora)}"
    if error is not None:
        return record._replace(error=error)
    return record._replace(
        prompt=prompt, messages=messages, sampling=overrides, lora=lora, chat=chat
    )


def misspelled_field(obj: dict[str, Any], known: Sequence[str] = NATIVE_FIELDS) -> str | None:
    """An unknown field that is a near miss of a known one ("temprature"), which would
    otherwise be dropped unseen; other unknown fields (a line's own metadata) are left alone."""
    for name in obj:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            return f"unknown field {name!r}; did you mean {close[0]!r}?"
    return None


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
