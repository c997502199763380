"""vLLM's chat options: a chat template of one's own (--chat-template), the template's variables
(chat_template_kwargs per line over --default-chat-template-kwargs), add_generation_prompt and
continue_final_message, and --reasoning-parser splitting <think> reasoning from the content."""

import json
import re

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.chat_template import ChatTemplate
from pagedgen.io.output import RecordFormatter
from pagedgen.io.reasoning import split_reasoning
from pagedgen.io.records import InputRecord
from pagedgen.io.tools import check_tools, parse_tool_calls
from pagedgen.outputs import CompletionOutput, RequestMetrics, RequestOutput
from tests.cli_util import run_in_process

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}"
)
HI = [{"role": "user", "content": "hi"}]
QUIET = dict(log=lambda message: None, kv_cache_memory=0.01)


@pytest.mark.parametrize(
    "text, deepseek_r1, qwen3",
    [
        ("<think>abc</think>answer", ("abc", "answer"), ("abc", "answer")),
        ("abc</think>answer", ("abc", "answer"), ("abc", "answer")),  # <think> in the prompt
        ("still thinking", ("still thinking", None), (None, "still thinking")),
        ("<think>x</think>", ("x", None), ("x", None)),
        ("<think></think>plain", (None, "plain"), (None, "plain")),
    ],
)
def test_split_reasoning_as_vllms_parsers(text, deepseek_r1, qwen3):
    assert split_reasoning("deepseek_r1", text) == deepseek_r1
    assert split_reasoning("qwen3", text) == qwen3


def test_llm_chat_takes_vllms_template_options(tiny_llama_path):
    llm = LLM(str(tiny_llama_path), **QUIET)
    params = SamplingParams(temperature=0, max_tokens=2)
    encode = llm.tokenizer.encode

    def prompt_of(**options) -> list[int]:
        return llm.chat(HI, params, use_tqdm=False, **options)[0].prompt_token_ids

    assert prompt_of() == encode("user: hi\nassistant: ", add_special_tokens=False)
    assert prompt_of(chat_template=TEMPLATE) == encode("<user>hi<assistant>")
    no_think = prompt_of(chat_template=TEMPLATE, chat_template_kwargs={"enable_thinking": False})
    assert no_think == encode("<user>hi<assistant><no_think>")
    started = [*HI, {"role": "assistant", "content": "Hel"}]
    open_ended = llm.chat(
        started,
        params,
        use_tqdm=False,
        chat_template=TEMPLATE,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert open_ended[0].prompt_token_ids == encode("<user>hi<assistant>Hel")
    with pytest.raises(ValueError, match="exclude each other"):
        llm.chat(started, params, use_tqdm=False, continue_final_message=True)


def prompt_tokens(stdout: str) -> list[int]:
    return [json.loads(line)["prompt_tokens"] for line in stdout.splitlines()]


def test_cli_chat_template_options(tiny_llama_path, tmp_path, capsys):
    template_file = tmp_path / "template.jinja"
    template_file.write_text(TEMPLATE)
    lines = [
        {"messages": HI},  # <user>hi<assistant>: 19 bytes
        {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}},  # + <no_think>
        {  # <user>hi<assistant>Hel
            "messages": [*HI, {"role": "assistant", "content": "Hel"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        {"prompt": "x", "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": HI, "continue_final_message": True},
        {"messages": HI, "add_generation_prompt": "no"},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    common = ("-m", str(tiny_llama_path), "--kv-cache-memory", "0.01", "--no-progress")
    for template in (str(template_file), TEMPLATE):
        code, stdout, stderr = run_in_process(
            capsys, "run", "-", "-o", "-", *common, "--max-tokens", "1",
            "--chat-template", template, stdin=stdin,
        )  # fmt: skip
        assert code == 1, stderr  # some lines failed
        records = [json.loads(line) for line in stdout.splitlines()]
        assert prompt_tokens(stdout)[:3] == [19, 29, 22]
        assert "applies to 'messages', not to a plain prompt" in records[3]["error"]
        assert "needs 'add_generation_prompt': false" in records[4]["error"]
        assert "'add_generation_prompt' must be a bool" in records[5]["error"]
        assert len({r["request_hash"] for r in records[:2]}) == 2  # the kwargs are asked for

    defaults = '{"enable_thinking": false}'
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, "--max-tokens", "1", "--chat-template", TEMPLATE,
        "--default-chat-template-kwargs", defaults,
        stdin=b'{"messages": [{"role": "user", "content": "hi"}]}\n'
        b'{"messages": [{"role": "user", "content": "hi"}], '
        b'"chat_template_kwargs": {"enable_thinking": true}}\n',
    )  # fmt: skip
    assert code == 0, stderr
    assert prompt_tokens(stdout) == [29, 19]  # the default, then the line's own over it

    request = {  # an OpenAI batch body takes the same fields
        "custom_id": "a",
        "url": "/v1/chat/completions",
        "body": {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}},
    }
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, "--max-tokens", "1", "--chat-template", TEMPLATE,
        stdin=(json.dumps(request) + "\n").encode(),
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(stdout)["response"]["body"]["usage"]["prompt_tokens"] == 29

    code, _, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, "--chat-template", str(tmp_path / "missing"),
        stdin=b"",
    )  # fmt: skip
    assert code == 2 and "no such file" in stderr


def answered(text: str) -> RequestOutput:
    completion = CompletionOutput(0, text, [1] * len(text), finish_reason="stop")
    return RequestOutput("0", None, [1, 2], [completion], RequestMetrics(0.0, 1.0, 2.0))


def test_records_carry_the_split_answer():
    """pagedgen's records: text is the content beside "reasoning"; OpenAI chat responses: the
    message's content and reasoning_content; a plain prompt's answer is left whole."""
    chat = InputRecord(1, "a", messages=HI)
    plain = InputRecord(2, "b", prompt="hi")
    output = answered("<think>abc</think>de")
    native = RecordFormatter(False, "m", None, "qwen3")
    record = native.output(chat, output, 0)
    assert (record["reasoning"], record["text"]) == ("abc", "de")
    assert native.output(plain, output, 0)["text"] == "<think>abc</think>de"
    openai = RecordFormatter(True, "m", None, "deepseek_r1")
    message = openai.output(chat._replace(endpoint="chat"), output, 0)["response"]["body"]
    message = message["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("abc", "de")


THINKING = (  # a template that opens the reasoning, or with thinking off closes it (Qwen3's way)
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant><think>"
    "{% if enable_thinking is defined and not enable_thinking %}</think>{% endif %}"
)


def test_structured_output_holds_the_answer_after_the_reasoning(tiny_llama_path, capsys):
    """With a reasoning parser, a constraint holds only what follows </think>, as in vLLM: where
    the prompt closes the reasoning the whole answer is held; where it leaves it open, the
    random model reasons freely and never closes it, so nothing holds its answer."""
    common = ("-m", str(tiny_llama_path), "--kv-cache-memory", "0.01", "--no-progress")
    constrained = ("--temperature", "0", "--regex", "[a-z]{4}", "--max-tokens", "12")
    closed = {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}}
    lines = (json.dumps(closed) + "\n" + json.dumps({"messages": HI}) + "\n").encode()
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--chat-template", THINKING,
        "--reasoning-parser", "qwen3", stdin=lines,
    )  # fmt: skip
    assert code == 0, stderr
    held, free = (json.loads(line) for line in stdout.splitlines())
    assert re.fullmatch("[a-z]{4}", held["text"]) and held["finish_reason"] == "stop"
    assert held["reasoning"] is None  # qwen3: no </think> in the answer, all content
    assert free["completion_tokens"] == 12 and not re.fullmatch("[a-z]{4}", free["text"])

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--chat-template", THINKING,
        stdin=lines,
    )  # fmt: skip
    assert code == 0, stderr  # without a parser the constraint holds from the first token
    assert all(len(json.loads(line)["text"]) == 4 for line in stdout.splitlines())

    code, _, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, "--reasoning-parser", "nope", stdin=lines
    )
    assert code == 2 and "reasoning_parser must be one of" in stderr


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


def test_the_gate_opens_past_the_first_think_end_of_the_output(tiny_llama_path):
    """Scripted outputs through a request's grammars: none while the sequence reasons, then the
    grammar over the tokens after </think> only, however the prompt ended."""
    from transformers import AutoTokenizer

    from pagedgen.engine.sequence import Sequence
    from pagedgen.sampling_params import StructuredOutputsParams
    from pagedgen.structured_output.backend import GuidanceBackend
    from pagedgen.structured_output.manager import RequestGrammars
    from pagedgen.structured_output.reasoning_gate import ReasoningGate, reasoning_markers

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    compiled = GuidanceBackend(tokenizer, 257, {256}).compile(StructuredOutputsParams(regex="ab"))
    encode, markers = tokenizer.encode, reasoning_markers(tokenizer)
    for seq_id, prompt in enumerate(("<think>", "q", "<think>x</think>y<think>")):
        grammars = RequestGrammars(compiled, ReasoningGate(markers))
        seq = Sequence(seq_id, "r", encode(prompt), SamplingParams())
        for token in encode("hm </think"):
            seq.append_token_id(token)
            assert grammars.grammar_of(seq) is None  # reasoning: nothing holds the answer
        seq.append_token_id(encode(">")[0])
        grammar = grammars.grammar_of(seq)
        assert grammar is not None and grammar.token_ids == [] and not grammar.is_terminated
        for token in encode("ab"):
            seq.append_token_id(token)
        assert grammars.grammar_of(seq).is_terminated

    closed = Sequence(9, "r", encode("<think>x</think>"), SamplingParams())
    closed.append_token_id(encode("a")[0])
    grammar = RequestGrammars(compiled, ReasoningGate(markers)).grammar_of(closed)
    assert grammar is not None and grammar.token_ids == encode("a")
