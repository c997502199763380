"""vLLM's chat options: a chat template of one's own (--chat-template), the template's variables
(chat_template_kwargs per line over --default-chat-template-kwargs), add_generation_prompt and
continue_final_message, and --reasoning-parser splitting <think> reasoning from the content."""

import json
import re

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.entrypoints.io.output import RecordFormatter
from pagedgen.entrypoints.io.reasoning import split_reasoning
from pagedgen.entrypoints.io.records import InputRecord
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


def test_the_gate_opens_past_the_first_think_end_of_the_output(tiny_llama_path):
    """Scripted outputs through a request's grammars: none while the sequence reasons, then the
    grammar over the tokens after </think> only, however the prompt ended."""
    from transformers import AutoTokenizer

    from pagedgen.core.sequence import Sequence
    from pagedgen.engine.structured_output.backend import GuidanceBackend
    from pagedgen.engine.structured_output.manager import RequestGrammars
    from pagedgen.engine.structured_output.reasoning_gate import ReasoningGate, reasoning_markers
    from pagedgen.sampling_params import StructuredOutputsParams

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
