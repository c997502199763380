"""vLLM's tool calling: --tool-call-parser reading calls out of the answer (hermes, llama3_json,
pythonic), tools and tool_choice checked and handed to the template, and a forced tool_choice
constraining the answer to calls."""

import json

import pytest

from pagedgen import LLM
from pagedgen.entrypoints.chat_template import ChatTemplate
from pagedgen.entrypoints.io.tools import check_tools, parse_tool_calls
from tests.cli_util import run_in_process
from tests.entrypoints.test_chat_options import HI, QUIET

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


@pytest.mark.parametrize(
    "parser, text, content, calls",
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None,
         [("f", {"x": 1})]),
        ("hermes", 'Let me look.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
         '<tool_call>{"name": "g", "arguments": {"y": "z"}}', "Let me look.",
         [("f", {}), ("g", {"y": "z"})]),  # the last one unterminated, as a stop cuts it
        ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        ("hermes", "no call here", "no call here", []),
        ("llama3_json", '{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", '
         '"parameters": {"a": [1]}}', None, [("f", {}), ("g", {"a": [1]})]),
        ("llama3_json", "The answer is 4.", "The answer is 4.", []),
        ("pythonic", '[get_weather(city="Paris", days=2), now()]', None,
         [("get_weather", {"city": "Paris", "days": 2}), ("now", {})]),
        ("pythonic", '<|python_start|>[f(a=[1, {"b": None}], c=True)]<|python_end|>', None,
         [("f", {"a": [1, {"b": None}], "c": True})]),
        ("pythonic", "[f(x=__import__('os').getcwd())]", "[f(x=__import__('os').getcwd())]",
         []),  # not a literal: nothing runs, nothing is read
        ("pythonic", "[f(1)]", "[f(1)]", []),  # positional: no parameter names
        ("pythonic", "[f(**k)]", "[f(**k)]", []),
        ("pythonic", "[1, 2]", "[1, 2]", []),
        ("pythonic", "Paris is sunny [see f(x=1)]", "Paris is sunny [see f(x=1)]", []),
    ],
)  # fmt: skip
def test_tool_call_parsers_as_vllms(parser, text, content, calls):
    got_content, got_calls = parse_tool_calls(parser, text)
    assert got_content == content
    assert [(c["name"], json.loads(c["arguments"])) for c in got_calls] == calls


def test_tools_reach_the_template_with_object_arguments(tiny_llama_path):
    """The template sees the tools, and an earlier call's arguments as an object (OpenAI's
    format holds them as a JSON string), as vLLM hands them over."""
    template = (
        "{% for t in tools or [] %}[{{ t['function']['name'] }}]{% endfor %}"
        "{% for m in messages %}{% for c in m.get('tool_calls') or [] %}"
        "({{ c['function']['arguments']['city'] }}){% endfor %}{% endfor %}"
    )
    llm = LLM(str(tiny_llama_path), **QUIET)
    messages = [
        *HI,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "paris"}'},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ]
    prompt = llm.apply_chat_template(messages, ChatTemplate(template), tools=[WEATHER])
    assert llm.tokenizer.decode(prompt) == "[get_weather](paris)"


def test_cli_tool_calls(tiny_llama_path, capsys):
    """A regex makes the random model call get_weather; hermes reads the call into the
    response's tool_calls, finish_reason tool_calls. Without a parser a request with tools and
    tool_choice auto fails alone; with tool_choice none its answer stays text."""
    call = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "[a-z]{5}"\}\}</tool_call>'
    common = ("-m", str(tiny_llama_path), "--kv-cache-memory", "0.01", "--no-progress")
    constrained = ("--temperature", "0", "--regex", call, "--max-tokens", "96")

    def request(**body) -> bytes:
        body = {"messages": HI, "tools": [WEATHER], **body}
        line = {"custom_id": "a", "url": "/v1/chat/completions", "body": body}
        return (json.dumps(line) + "\n").encode()

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--tool-call-parser", "hermes",
        stdin=request(),
    )  # fmt: skip
    assert code == 0, stderr
    choice = json.loads(stdout)["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["function"]["name"] == "get_weather"
    assert len(json.loads(tool_call["function"]["arguments"])["city"]) == 5

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, stdin=request()
    )
    assert code == 1 and "need --tool-call-parser" in json.loads(stdout)["error"]["message"]

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--tool-call-parser", "hermes",
        stdin=request(tool_choice="none"),
    )  # fmt: skip
    assert code == 0, stderr
    message = json.loads(stdout)["response"]["body"]["choices"][0]["message"]
    assert message["content"].startswith("<tool_call>") and "tool_calls" not in message

    code, stdout, _ = run_in_process(
        capsys, "run", "-", "-o", "-", *common, stdin=request(tool_choice="any")
    )
    assert "'tool_choice' must be one of" in json.loads(stdout)["error"]["message"]


def test_cli_runs_a_conversation_with_an_earlier_call(tiny_llama_path, capsys):
    """An assistant turn that only calls a tool has content null, as OpenAI writes it: the
    line runs (its length check counts no text there)."""
    earlier_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}],
    }  # fmt: skip
    messages = [*HI, earlier_call, {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    body = {"messages": messages, "max_tokens": 2}
    line = {"custom_id": "a", "url": "/v1/chat/completions", "body": body}
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", "-m", str(tiny_llama_path), "--kv-cache-memory", "0.01",
        "--no-progress", stdin=(json.dumps(line) + "\n").encode(),
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(stdout)["error"] is None


@pytest.mark.parametrize(
    "tools, tool_choice, error",
    [
        ("f", None, "'tools' must be a list"),
        (["f"], None, "tools[0] must be"),
        ([{"type": "function"}], None, "tools[0] must be"),
        ([WEATHER], "any", "'tool_choice' must be one of"),
        ([WEATHER], "auto", None),
        ([WEATHER], "required", None),
        (None, "required", "needs 'tools'"),
        ([WEATHER], {"type": "function", "function": {"name": "f"}}, "none of the tools"),
        ([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None),
        ([WEATHER], {"function": "get_weather"}, "'tool_choice' must be {"),
    ],
)
def test_tool_fields_are_checked(tools, tool_choice, error):
    found = check_tools(tools, tool_choice)
    assert found is None if error is None else error in found


def test_forced_tool_choice_constrains_the_answer_to_calls(tiny_llama_path, capsys):
    """tool_choice "required" and a named function need no parser: structured output makes the
    random model answer with calls (an array of {name, parameters}, or the function's
    arguments), and they come back as tool_calls."""
    lookup = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "maxLength": 3}},
                "required": ["q"],
                "additionalProperties": False,
            },
        },
    }
    echo = {"type": "function", "function": {**lookup["function"], "name": "echo"}}
    tools = [lookup, echo]  # short arguments: the answer closes well within max_tokens
    common = ("-m", str(tiny_llama_path), "--kv-cache-memory", "0.01", "--no-progress")

    def run(tool_choice) -> dict:
        body = {"messages": HI, "tools": tools, "tool_choice": tool_choice, "max_tokens": 200}
        line = {"custom_id": "a", "url": "/v1/chat/completions", "body": body}
        code, stdout, stderr = run_in_process(
            capsys, "run", "-", "-o", "-", *common, "--temperature", "0",
            stdin=(json.dumps(line) + "\n").encode(),
        )  # fmt: skip
        assert code == 0, stderr
        return json.loads(stdout)["response"]["body"]["choices"][0]

    named = run({"type": "function", "function": {"name": "lookup"}})
    (call,) = named["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup" and named["message"]["content"] is None
    assert set(json.loads(call["function"]["arguments"])) == {"q"}

    required = run("required")
    calls = required["message"]["tool_calls"]
    assert calls and required["finish_reason"] == "tool_calls"
    assert {c["function"]["name"] for c in calls} <= {"echo", "lookup"}
    for c in calls:
        assert isinstance(json.loads(c["function"]["arguments"]), dict)
