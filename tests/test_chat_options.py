"""vLLM's chat options: a chat template of one's own (--chat-template), the template's variables
(chat_template_kwargs per line over --default-chat-template-kwargs), add_generation_prompt and
continue_final_message, and --reasoning-parser splitting <think> reasoning from the content."""

import json

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.io.reasoning import split_reasoning
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
        {"prompt": "x", "chat_template_kwargs": {}},
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


def test_cli_reasoning_parser(tiny_llama_path, capsys):
    """A regex makes the random model answer <think>abc</think>de; the parser splits it, in
    pagedgen's records and in OpenAI chat responses (reasoning_content), and leaves plain prompts
    alone."""
    common = ("-m", str(tiny_llama_path), "--kv-cache-memory", "0.01", "--no-progress")
    constrained = ("--temperature", "0", "--regex", "<think>[a-z]{3}</think>[a-z]{2}")
    lines = b'{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": "hi"}\n'
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--reasoning-parser", "qwen3",
        stdin=lines,
    )  # fmt: skip
    assert code == 0, stderr
    chat, plain = (json.loads(line) for line in stdout.splitlines())
    assert len(chat["reasoning"]) == 3 and len(chat["text"]) == 2
    assert "reasoning" not in plain and plain["text"].startswith("<think>")

    request = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32},
    }
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, *constrained, "--reasoning-parser", "deepseek_r1",
        stdin=(json.dumps(request) + "\n").encode(),
    )  # fmt: skip
    assert code == 0, stderr
    message = json.loads(stdout)["response"]["body"]["choices"][0]["message"]
    assert len(message["reasoning_content"]) == 3 and len(message["content"]) == 2

    code, _, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *common, "--reasoning-parser", "nope", stdin=lines
    )
    assert code == 2 and "--reasoning-parser must be one of" in stderr
