"""Tools in chat requests, as vLLM's OpenAI server takes them: the request's tools go to the
chat template, and with tool_choice "auto" (the default where there are tools) the answer is
parsed for tool calls by a --tool-call-parser, vLLM's names:

  hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them
               (Qwen 2.5 / 3, Hermes); the text before the first is the content
  llama3_json  the whole answer one JSON call {"name": ..., "parameters": {...}}, or several
               joined by ";" (Llama 3.1+), after an optional <|python_tag|>
  pythonic     the whole answer a Python list of calls with literal keyword arguments,
               [get_weather(city="Paris", days=2), ...] (Llama 3.2 and 4), read without
               running anything (ast.literal_eval)
  openai       gpt-oss's harmony messages to=functions.NAME (io/harmony.py), read from the
               whole answer, its special tokens kept

An answer that does not parse as calls stays content, as vLLM's parsers leave it.

tool_choice "required" and a named function ({"type": "function", "function": {"name": f}})
need no parser: as vLLM, the answer is constrained by structured output to a JSON array of
calls {"name", "parameters"} (tool_schema), or to the named function's parameters, and read as
those calls.
"""

import ast
import json
import re
from typing import Any, NamedTuple

from pagedgen.entrypoints.io.harmony import harmony_tool_calls
from pagedgen.entrypoints.io.reasoning import split_reasoning

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "pythonic", "openai")
TOOL_CHOICES = ("none", "auto", "required")  # or {"type": "function", "function": {"name"}}
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class Answer(NamedTuple):
    """A chat answer as the parsers read it: reasoning, content and tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]


def read_answer(
    text: str, reasoning_parser: str | None, tool_call_parser: str | None, chat: dict[str, Any]
) -> Answer:
    """The reasoning split off first (io/reasoning.py), then the content read for tool calls
    where the request asks for them, as vLLM's server reads an answer."""
    reasoning, content = None, text
    if reasoning_parser is not None:
        reasoning, content = split_reasoning(reasoning_parser, text)
    calls: list[dict[str, Any]] = []
    choice = chat.get("tool_choice")
    if isinstance(choice, dict) and content is not None:  # the named function's arguments
        return Answer(reasoning, None, [{"name": choice["function"]["name"], "arguments": content}])
    if choice == "required" and content is not None:
        try:
            called = json.loads(content)
        except json.JSONDecodeError:  # cut short by max_tokens
            return Answer(reasoning, content, [])
        calls = [_call(json.dumps(c), "parameters") for c in called if isinstance(c, dict)]
        return Answer(reasoning, None, [c for c in calls if c is not None])
    if tool_call_parser is not None and parses_tool_calls(chat):
        # harmony's calls (openai) lie outside the content: that parser reads the whole answer
        source = text if tool_call_parser == "openai" else content
        if source is not None:
            content, calls = parse_tool_calls(tool_call_parser, source)
    return Answer(reasoning, content, calls)


def forces_tool_calls(chat: dict[str, Any]) -> bool:
    """tool_choice "required" or a named function: the answer is held to calls (tool_schema)."""
    choice = chat.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


def tool_schema(chat: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema an answer must follow for tool_choice "required" or a named function
    (vLLM's), or None."""
    choice, tools = chat.get("tool_choice"), chat.get("tools") or []

    def parameters(tool: dict[str, Any]) -> dict[str, Any]:
        return tool["function"].get("parameters") or {"type": "object"}

    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return parameters(next(t for t in tools if t["function"]["name"] == name))
    if choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [tool["function"]["name"]]},
                "parameters": parameters(tool),
            },
            "required": ["name", "parameters"],
        }
        for tool in tools
    ]
    return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}


def parses_tool_calls(chat: dict[str, Any]) -> bool:
    """Whether a request's answer is read for tool calls: it has tools, tool_choice "auto"."""
    return bool(chat.get("tools")) and chat.get("tool_choice", "auto") == "auto"


def check_tools(tools: object, tool_choice: object) -> str | None:
    """Why a request's tools or tool_choice cannot run, or None."""
    named = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if isinstance(tool_choice, dict):
        if not (tool_choice.get("type") == "function" and isinstance(named, dict)):
            return "'tool_choice' must be {'type': 'function', 'function': {'name': ...}}"
    elif tool_choice is not None and tool_choice not in TOOL_CHOICES:
        return f"'tool_choice' must be one of {TOOL_CHOICES} or a function, got {tool_choice!r}"
    if tools is None:
        forced = tool_choice == "required" or named is not None
        return "'tool_choice' required or a function needs 'tools'" if forced else None
    if not isinstance(tools, list):
        return "'tools' must be a list of {'type': 'function', 'function': {...}}"
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(function, dict)
            and tool.get("type") == "function"
            and isinstance(function.get("name"), str)
        ):
            return f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
    if named is not None and named.get("name") not in [t["function"]["name"] for t in tools]:
        return f"'tool_choice' names {named.get('name')!r}, which is none of the tools"
    return None


def parse_tool_calls(parser: str, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls): each call {"name", "arguments"} with arguments a JSON string."""
    if parser == "hermes":
        found = _HERMES.findall(text)
        calls = [_call(body.strip(), "arguments") for body in found]
        if not found or None in calls:
            return text, []
        content = text[: text.index("<tool_call>")].strip()
        return content or None, calls
    if parser == "llama3_json":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        calls = [_call(part.strip(), "parameters") for part in body.split(";") if part.strip()]
        if not calls or None in calls:
            return text, []
        return None, calls
    if parser == "pythonic":
        calls = _pythonic_calls(text)
        return (text, []) if calls is None else (None, calls)
    if parser == "openai":
        return harmony_tool_calls(text)
    raise ValueError(f"tool call parser must be one of {TOOL_CALL_PARSERS}, got {parser!r}")


def _pythonic_calls(text: str) -> list[dict[str, Any]] | None:
    """[f(a=1), g(b="x")] as calls, or None unless the whole text is such a list of calls of
    names with literal keyword arguments only."""
    body = text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
    if not body.startswith("["):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except ValueError:
            return None
        calls.append({"name": node.func.id, "arguments": json.dumps(arguments, ensure_ascii=False)})
    return calls


def _call(body: str, arguments_key: str) -> dict[str, Any] | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get(arguments_key, call.get("arguments", {}))
    return {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: content given as OpenAI's text parts as one string
    (text_messages), and an assistant's tool call arguments as objects, not the JSON strings of
    OpenAI's format (vLLM converts both)."""
    converted = []
    for i, message in enumerate(text_messages(messages)):
        if isinstance(message.get("content"), list):
            raise ValueError(f"messages[{i}]: only text content parts are supported")
        calls = message.get("tool_calls")
        if calls:
            calls = [_with_object_arguments(call) for call in calls]
            message = {**message, "tool_calls": calls}
        converted.append(message)
    return converted


def text_messages(messages: Any) -> Any:
    """Each message whose content is a list of {"type": "text", "text"} parts with that content
    as one string, the parts joined by newlines, as vLLM gives a text-only chat template; any
    other value as it was."""
    if not isinstance(messages, list):
        return messages
    joined = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            message = {**message, "content": "\n".join(p["text"] for p in content)}
        joined.append(message)
    return joined


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except json.JSONDecodeError:
            return call
        return {**call, "function": {**function, "arguments": arguments}}
    return call
