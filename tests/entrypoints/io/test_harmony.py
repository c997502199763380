"""gpt-oss's harmony answers: --reasoning-parser openai_gptoss and --tool-call-parser openai (vLLM's
names) read the channels from the answer's tokens with their special tokens kept."""

import json

import pytest

from pagedgen.entrypoints.io.harmony import SPECIAL_TOKENS, harmony_tool_calls, split_harmony
from pagedgen.entrypoints.io.output import RecordFormatter
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.tools import read_answer
from pagedgen.outputs import CompletionOutput, RequestMetrics, RequestOutput
from tests.conftest import build_tokenizer

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.parametrize(
    "text,expected",
    [
        (ANALYSIS + FINAL, ("The user wants the weather.", "It is sunny in Paris.")),
        ("<|channel|>analysis<|message|>Thinking, cut sh", ("Thinking, cut sh", None)),
        (  # cut in the final message: what it wrote so far is content
            ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is",
            ("The user wants the weather.", "It is"),
        ),
        ("<|channel|>final<|message|>No reasoning.<|return|>", (None, "No reasoning.")),
        ("Plain text, no channels", (None, "Plain text, no channels")),
        (  # two analysis messages, a preamble to the user, the answer
            ANALYSIS + "<|start|>assistant<|channel|>analysis<|message|>More.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Checking. <|end|>" + FINAL,
            ("The user wants the weather.\nMore.", "Checking. It is sunny in Paris."),
        ),
    ],
)
def test_channels_split_into_reasoning_and_content(text, expected):
    assert split_harmony(text) == expected


def test_calls_are_the_messages_to_functions():
    content, calls = harmony_tool_calls(ANALYSIS + CALL)
    assert content is None
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    second = CALL.replace("get_weather", "get_time").replace("Paris", "Rome")
    content, calls = harmony_tool_calls(ANALYSIS + CALL + second + FINAL)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert content == "It is sunny in Paris."
    assert harmony_tool_calls(ANALYSIS + FINAL) == ("It is sunny in Paris.", [])


def test_read_answer_with_both_parsers():
    chat = {"tools": TOOLS}
    answer = read_answer(ANALYSIS + CALL, "openai_gptoss", "openai", chat)
    assert answer.reasoning == "The user wants the weather."
    assert answer.content is None and answer.tool_calls[0]["name"] == "get_weather"
    no_tools = read_answer(ANALYSIS + CALL, "openai_gptoss", "openai", {})
    assert no_tools.tool_calls == [] and no_tools.content is None


@pytest.fixture(scope="module")
def harmony_tokenizer(tmp_path_factory):
    """The byte tokenizer with harmony's markers as special tokens, as gpt-oss's has them."""
    tokenizer = build_tokenizer(tmp_path_factory.mktemp("harmony"))
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, "<|constrain|>"]})
    return tokenizer


def answer_of(tokenizer, raw: str) -> RequestOutput:
    """A finished request whose tokens spell raw; its text drops the special tokens, as the
    engine's detokenizer does."""
    token_ids = tokenizer.encode(raw, add_special_tokens=False)
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    completion = CompletionOutput(0, text, token_ids, finish_reason="stop")
    return RequestOutput("0", None, [1, 2], [completion], RequestMetrics(0.0, 1.0, 2.0))


def test_records_read_the_tokens_not_the_text(harmony_tokenizer):
    """The text has lost the markers ("analysis...assistantfinal..."); the formatter decodes the
    tokens again with them, for pagedgen's lines and OpenAI's responses alike."""
    output = answer_of(harmony_tokenizer, ANALYSIS + CALL)
    assert "<|channel|>" not in output.outputs[0].text
    record = InputRecord(
        1, "a", messages=[{"role": "user", "content": "hi"}], chat={"tools": TOOLS}
    )
    native = RecordFormatter(False, "m", harmony_tokenizer, "openai_gptoss", "openai")
    line = native.output(record, output, 0)
    assert line["reasoning"] == "The user wants the weather." and line["text"] is None
    assert line["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    openai = RecordFormatter(True, "m", harmony_tokenizer, "openai_gptoss", "openai")
    body = openai.output(record._replace(endpoint="chat"), output, 0)["response"]["body"]
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants the weather."
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    final = answer_of(harmony_tokenizer, ANALYSIS + FINAL)
    plain = RecordFormatter(False, "m", harmony_tokenizer, "openai_gptoss")
    line = plain.output(record._replace(chat={}), final, 0)
    assert (line["reasoning"], line["text"]) == (
        "The user wants the weather.",
        "It is sunny in Paris.",
    )


def test_structured_output_waits_for_the_final_channel(harmony_tokenizer):
    from pagedgen.core.sequence import Sequence
    from pagedgen.engine.structured_output.reasoning_gate import ReasoningGate, reasoning_markers
    from pagedgen.sampling_params import SamplingParams

    encode = lambda text: harmony_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    gate = ReasoningGate(reasoning_markers(harmony_tokenizer, "openai_gptoss"))
    seq = Sequence(
        0, "r", encode("<|start|>user<|message|>hi<|end|><|start|>assistant"), SamplingParams()
    )
    for token in encode(ANALYSIS + "<|start|>assistant"):
        seq.append_token_id(token)
        assert gate.content_start(seq) is None
    for token in encode("<|channel|>final<|message|>"):
        seq.append_token_id(token)
    assert gate.content_start(seq) == len(seq.output_token_ids)
    skipped = Sequence(
        1, "r", encode("<|start|>assistant<|channel|>final<|message|>"), SamplingParams()
    )
    skipped.append_token_id(encode("a")[0])
    assert gate.content_start(skipped) == 0  # the prompt opened the final channel itself
