"""OpenAI's harmony format (gpt-oss), read from an answer's text with its special tokens kept
(the detokenized text drops them). An answer is a run of messages, the first one's
<|start|>assistant in the prompt already:

  [<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>FORMAT]<|message|>TEXT

each closed by <|end|>, <|call|> (a tool call) or <|return|> (the answer's end), or cut short
by max_tokens. Channels: analysis (the reasoning), commentary (a call to=functions.NAME with
JSON arguments, or a preamble to the user), final (the answer). vLLM's reasoning parser
openai_gptoss and tool call parser openai read them so: the analysis messages are the reasoning,
the final and preamble messages the content, the calls the tool calls.
"""

import re
from typing import Any, NamedTuple

SPECIAL_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>")
_MESSAGE_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class Message(NamedTuple):
    channel: str | None  # None: a header without one
    recipient: str | None  # functions.NAME for a tool call
    text: str


def messages(text: str) -> list[Message] | None:
    """The answer's messages, or None where it has no harmony header at all."""
    if "<|message|>" not in text:
        return None
    found = []
    while "<|message|>" in text:
        header, _, rest = text.partition("<|message|>")
        header = header.rpartition("<|start|>")[2]
        end = _MESSAGE_END.search(rest)
        body, text = (rest, "") if end is None else (rest[: end.start()], rest[end.end() :])
        channel, recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
        found.append(
            Message(
                channel.group(1) if channel else None,
                recipient.group(1) if recipient else None,
                body,
            )
        )
    return found


def split_harmony(text: str) -> tuple[str | None, str | None]:
    """(reasoning, content): the analysis messages, joined by newlines; the final ones and any
    commentary addressed to no one (a preamble). Text with no harmony header is all content."""
    found = messages(text)
    if found is None:
        return None, text or None
    reasoning = [m.text for m in found if m.channel == "analysis"]
    return "\n".join(reasoning) or None, _content(found)


def _content(found: list[Message]) -> str | None:
    """The final messages and any commentary addressed to no one (a preamble), joined."""
    content = [m.text for m in found if m.channel != "analysis" and m.recipient is None]
    return "".join(content) or None


def harmony_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls): each message to=functions.NAME a call {"name", "arguments"}, its text
    the arguments (JSON, as the model wrote them); the content as split_harmony reads it."""
    found = messages(text)
    if found is None:
        return text or None, []
    calls = [
        {"name": m.recipient.removeprefix("functions."), "arguments": m.text.strip()}
        for m in found
        if m.recipient is not None and m.recipient.startswith("functions.")
    ]
    return _content(found), calls


def uses_harmony(reasoning_parser: str | None, tool_call_parser: str | None) -> bool:
    """Whether the parsers read harmony, whose markers are special tokens the text drops."""
    return reasoning_parser == "openai_gptoss" or tool_call_parser == "openai"
