"""The chat options of `run` and `profile`: vLLM's --chat-template and
--default-chat-template-kwargs, built into a ChatTemplate, and `run`'s --tool-call-parser."""

from pathlib import Path

from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.cli.options import CHAT_PANEL, option
from pagedgen.entrypoints.io.tools import TOOL_CALL_PARSERS
from pagedgen.json_args import json_object

CHAT_TEMPLATE = option(
    CHAT_PANEL,
    None,
    "--chat-template",
    help="a Jinja chat template, or a file holding one, in place of the tokenizer's",
    metavar="FILE|TEMPLATE",
)
DEFAULT_CHAT_TEMPLATE_KWARGS = option(
    CHAT_PANEL,
    None,
    "--default-chat-template-kwargs",
    help='the template\'s variables for every conversation, JSON: {"enable_thinking": false}; '
    'a line\'s own "chat_template_kwargs" go over them',
    metavar="JSON",
)
APPLY_CHAT_TEMPLATE = option(
    CHAT_PANEL,
    False,
    "--apply-chat-template",
    help="send each plain text prompt through the chat template, as one user message (an "
    "instruct model's answer), as lm-eval's and SGLang's option of this name do",
)


TOOL_CALL_PARSER = option(
    CHAT_PANEL,
    None,
    "--tool-call-parser",
    help="read the tool calls of answers to requests with tools (tool_choice auto): hermes "
    "(<tool_call> tags: Qwen, Hermes), llama3_json, pythonic ([f(x=1)]: Llama 3.2, 4) or "
    "openai (gpt-oss's harmony calls)",
    metavar="NAME",
)


def check_tool_call_parser(tool_call_parser: str | None) -> None:
    if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"--tool-call-parser must be one of {TOOL_CALL_PARSERS}, got {tool_call_parser!r}"
        )


def chat_template(
    template: str | None, kwargs_json: str | None, apply_to_prompts: bool = False
) -> ChatTemplate:
    """The ChatTemplate of --chat-template (a file's text, or the template itself),
    --default-chat-template-kwargs and --apply-chat-template; raises ValueError for a bad one."""
    source = "--chat-template"
    if template is not None and "{" not in template:
        path = Path(template)
        if not path.is_file():
            raise ValueError(f"--chat-template: no such file {template!r}, nor a Jinja template")
        source, template = f"--chat-template {str(path)!r}", path.read_text()
    if template is not None:
        check_jinja(template, source)
    kwargs = json_object("--default-chat-template-kwargs", kwargs_json) or {}
    return ChatTemplate(template, kwargs, apply_to_prompts)


def check_jinja(template: str, source: str) -> None:
    """Raises ValueError if the template does not compile as apply_chat_template compiles it."""
    import jinja2

    try:  # transformers' own compiler (private): a plain sandbox lacks its {% generation %} tag
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # moved in some transformers: the template is checked when applied
        return
    try:
        _compile_jinja_template(template)  # jinja's sandbox, with transformers' tags and filters
    except jinja2.TemplateSyntaxError as e:
        message = (e.message or "syntax error").strip().splitlines()[0]
        raise ValueError(f"{source}: Jinja syntax error on line {e.lineno}: {message}") from e
