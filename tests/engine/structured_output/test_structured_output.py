"""Structured output without a real model: the params, the input formats, the CLI options, the
matcher's replay and rollback, the missing-extra error, and a batch job on the tiny model."""

import json
import re
import subprocess
import sys

import pytest

from pagedgen import SamplingParams, StructuredOutputsParams
from pagedgen.engine.structured_output import INSTALL_HINT
from pagedgen.entrypoints.batch.requests import RequestBuilder, RequestError
from pagedgen.entrypoints.cli.structured import structured_outputs_option
from pagedgen.entrypoints.io.openai_batch import parse_openai
from pagedgen.entrypoints.io.records import parse_native
from tests.cli_util import read_records, run_in_process, tiny, write_jsonl


def test_params_take_exactly_one_constraint_with_vllm_names():
    assert StructuredOutputsParams(json='{"type": "object"}').key == ("json", '{"type": "object"}')
    assert StructuredOutputsParams(choice=["a", "b"]).key == ("choice", '["a", "b"]')
    assert StructuredOutputsParams(json_object=True).key[0] == "json_object"
    for kwargs, message in [
        ({}, "exactly one"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"choice": []}, "non-empty list"),
        ({"regex": ""}, "non-empty string"),
        ({"json": "[1"}, "does not parse"),
        ({"json": "[1]"}, "schema object"),
        ({"json_object": False}, "json_object must be true"),
    ]:
        with pytest.raises(ValueError, match=message):
            StructuredOutputsParams(**kwargs)
    with pytest.raises(ValueError, match="unknown structured_outputs fields"):
        StructuredOutputsParams.from_dict({"guided_json": {}})


def test_native_and_openai_lines_carry_their_constraint():
    builder = RequestBuilder(None, {"max_tokens": 8}, 257, 8)
    native = parse_native({"prompt": [1, 2], "structured_outputs": {"regex": "[a-z]+"}}, 1)
    assert builder.prepare(native).params.structured_outputs == StructuredOutputsParams(
        regex="[a-z]+"
    )
    bad = parse_native({"prompt": [1], "structured_outputs": {"regex": "a", "choice": ["a"]}}, 2)
    with pytest.raises(RequestError, match="structured_outputs: .*exactly one"):
        builder.prepare(bad)

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"model": "m", "prompt": "x", "max_tokens": 4}
    formats = {
        "json_schema": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        "json_object": {"type": "json_object"},
        "text": {"type": "text"},
    }
    expected = {
        "json_schema": StructuredOutputsParams(json=schema),
        "json_object": StructuredOutputsParams(json_object=True),
        "text": None,
    }
    for name, response_format in formats.items():
        line = {"custom_id": name, "url": "/v1/completions", "body": {**body}}
        line["body"]["response_format"] = response_format
        record = parse_openai(line, 1)
        assert record.error is None, record.error
        params = RequestBuilder(None, {}, 257, 8).prepare(record._replace(prompt=[1])).params
        assert params.structured_outputs == expected[name], name
    line = {"custom_id": "x", "url": "/v1/completions", "body": {**body}}
    line["body"]["response_format"] = {"type": "json_schema", "json_schema": {}}
    assert "response_format.json_schema.schema" in parse_openai(line, 1).error


def test_cli_options_check_the_constraint_before_the_model_loads(tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text('{"type": "object", "properties": {"a": {"enum": [1, 2]}}}')
    assert structured_outputs_option(str(schema_file), None, None).json == {
        "type": "object",
        "properties": {"a": {"enum": [1, 2]}},
    }
    assert structured_outputs_option(None, None, "yes,no").choice == ["yes", "no"]
    assert structured_outputs_option(None, None, None) is None
    for args, message in [
        ((str(schema_file), "a", None), "give one of"),
        ((None, "(", None), "--regex: invalid regex"),
        ((str(tmp_path / "missing.json"), None, None), "--json-schema: cannot read"),
    ]:
        with pytest.raises(ValueError, match=message):
            structured_outputs_option(*args)


def test_missing_llguidance_names_the_install(monkeypatch):
    """llguidance absent (simulated: an import of it fails): a request that asks for structured
    output is rejected with the install command; the backend module names it too."""
    from pagedgen.config import EngineConfig
    from pagedgen.core.runner import NullRunner
    from pagedgen.engine.llm_engine import LLMEngine

    code = (
        "import sys; sys.modules['llguidance'] = None\n"
        "try:\n    import pagedgen.engine.structured_output.backend\n"
        "except ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == INSTALL_HINT, result.stderr
    assert "pip install 'pagedgen[structured]'" in INSTALL_HINT

    monkeypatch.setitem(sys.modules, "llguidance", None)
    config = EngineConfig(model="unused", block_size=4)
    engine = LLMEngine(config, NullRunner(lambda seq: 7), object(), 64, 0, 256, {0}, vocab_size=257)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+"))
    engine.add_request("r", [1, 2, 3], params)
    engine.add_request("free", [1, 2, 3], SamplingParams(max_tokens=2, detokenize=False))
    outputs = {out.request_id: out for out in engine.stream([])}
    assert INSTALL_HINT in outputs["r"].error
    assert outputs["r"].outputs[0].finish_reason == "error"
    assert outputs["free"].error is None and outputs["free"].num_output_tokens == 2


def test_the_matcher_replays_rolls_back_and_forks(tiny_llama_path):
    """A sequence's grammar follows its output tokens wherever they go: appended, cut back to a
    common prefix (a fork that replaced tokens), or rebuilt from the compiled grammar."""
    from transformers import AutoTokenizer

    from pagedgen.engine.structured_output.backend import GuidanceBackend
    from pagedgen.engine.structured_output.grammar import SequenceGrammar

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    backend = GuidanceBackend(tokenizer, 257, {256})
    compiled = backend.compile(StructuredOutputsParams(choice=["cat", "car", "dog"]))
    ids = {text: tokenizer.encode(text) for text in ("cat", "car", "ca", "dx")}

    grammar = SequenceGrammar(compiled.deep_copy())
    grammar.sync(ids["ca"])
    child = grammar.fork()
    grammar.sync(ids["cat"])
    child.sync(ids["car"])
    assert grammar.is_terminated and child.is_terminated
    grammar.sync(ids["car"])  # rolls "t" back, consumes "r"
    assert grammar.token_ids == ids["car"] and grammar.is_terminated
    grammar.sync(ids["ca"][:1])  # cut back to a shorter prefix: the grammar is open again
    assert not grammar.is_terminated and grammar.error is None
    bitmask, empty_rows = backend.fill_bitmask([grammar.matcher])
    allowed = [t for t in range(257) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1]
    assert allowed == tokenizer.encode("a") and empty_rows == []

    refused = SequenceGrammar(compiled.deep_copy())
    refused.sync(ids["dx"])
    assert refused.error is not None and "does not satisfy the grammar" in refused.error


def test_a_job_writes_an_error_record_for_a_bad_constraint_and_goes_on(
    tiny_llama_path, tmp_path, capsys
):
    rows = [
        {"id": "choice", "prompt": "a", "structured_outputs": {"choice": ["yes", "no"]}},
        {"id": "bad-schema", "prompt": "b", "structured_outputs": {"json": {"type": "bogus"}}},
        {"id": "bad-regex", "prompt": "c", "structured_outputs": {"regex": "(["}},
        {"id": "never", "prompt": "d", "structured_outputs": {"grammar": 'start: start "a"'}},
        {"id": "default", "prompt": "e"},
    ]
    source, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    args = ["run", str(source), "-o", str(out), *tiny(tiny_llama_path, 12), "--regex", "[0-9]{3}"]
    code, _, stderr = run_in_process(capsys, *args)
    assert code == 1, stderr  # some lines failed
    records = {r["id"]: r for r in read_records(out)}
    assert records["choice"]["text"] in ("yes", "no")
    assert records["choice"]["finish_reason"] == "stop"
    assert re.fullmatch("[0-9]{3}", records["default"]["text"])
    assert "invalid json" in records["bad-schema"]["error"]
    assert "invalid regex" in records["bad-regex"]["error"]
    assert "no output can satisfy the grammar" in records["never"]["error"]
    assert "grammars compiled" in stderr and "grammar mask per step" in stderr

    bad = ["run", str(source), "-o", "-", *tiny(tiny_llama_path), "--regex", "(", "--choice", "a"]
    code, _, stderr = run_in_process(capsys, *bad)
    assert code == 2 and "give one of --json-schema, --regex and --choice" in stderr


def test_a_grammar_at_a_dead_end_ends_its_sequence_with_an_error(tiny_llama_path, monkeypatch):
    """A state that allows no token (simulated: the bitmask comes back empty from the third
    step on) fails the sequence with a clear error instead of sampling forever."""
    import llguidance.numpy
    from transformers import AutoTokenizer

    from pagedgen.config import EngineConfig
    from pagedgen.core.runner import NullRunner
    from pagedgen.engine.llm_engine import LLMEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    (a,) = tokenizer.encode("a")
    fill, num_calls = llguidance.numpy.fill_next_token_bitmask_par, [0]

    def fill_then_dead_end(executor, matchers, bitmask) -> None:
        fill(executor, matchers, bitmask)
        num_calls[0] += 1
        if num_calls[0] >= 3:
            bitmask[:] = 0

    monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask_par", fill_then_dead_end)
    config = EngineConfig(model="unused", block_size=4)
    engine = LLMEngine(
        config, NullRunner(lambda seq: a), tokenizer, 64, 0, 256, {256}, vocab_size=257
    )
    params = SamplingParams(max_tokens=50, structured_outputs=StructuredOutputsParams(regex="a+"))
    engine.add_request("r", [1, 2, 3], params)
    (output,) = list(engine.stream([]))
    assert output.outputs[0].finish_reason == "error"
    assert "allows no next token after 2 output tokens" in output.error


def test_summary_rows_show_compile_and_mask_time():
    from pagedgen.engine.structured_output.manager import StructuredOutputStats
    from pagedgen.entrypoints.cli.summary import grammar_rows

    stats = StructuredOutputStats(num_grammars_compiled=2, compile_time_s=0.004)
    stats.num_masked_steps, stats.bitmask_fill_time_s, stats.num_masked_rows = 10, 0.02, 640
    summary = stats.summary()
    assert summary["grammar_compile_ms_mean"] == 2.0
    assert summary["grammar_mask_ms_per_step"] == 2.0
    assert json.dumps(summary) and len(grammar_rows(summary)) == 2
