import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pagedgen.entrypoints.io.readers import read_jsonl
from tests.cli_util import pagedgen, read_records, run_in_process, tiny

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}'

GOOD = [
    {"id": "a", "prompt": "hello there"},
    {"id": "b", "messages": [{"role": "user", "content": "hi"}]},
    {"prompt": [5, 6, 7]},
]


@pytest.mark.slow
def test_run_writes_one_record_per_line_in_order(tiny_llama_path, tmp_path):
    lines = [json.dumps(GOOD[0]), "{not json", json.dumps(GOOD[1]), '{"prompt": ""}']
    lines += [json.dumps(GOOD[2]), '{"id": "x", "prompt": "a", "messages": []}']
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    result = pagedgen("run", str(src), "-o", str(out), *tiny(tiny_llama_path))
    assert result.returncode == 1, result.stderr  # some lines failed
    records = read_records(out)
    assert [r["id"] for r in records] == ["a", "line-2", "b", "line-4", "line-5", "x"]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5, 6]
    errors = {r["id"]: r["error"] for r in records if r["error"]}
    assert set(errors) == {"line-2", "line-4", "x"}
    assert errors["line-2"].startswith("line 2: invalid JSON")
    assert errors["x"].startswith("line 6:")
    for r in records:
        if not r["error"]:
            assert r["completion_tokens"] == 5 and r["finish_reason"] in ("length", "stop")
            assert r["prompt_tokens"] > 0 and isinstance(r["text"], str)
            assert r["latency"] >= r["time_to_first_token"] > 0
    assert "3 failed" in result.stderr and "2, 4, 6" in result.stderr


@pytest.mark.slow
def test_stdin_to_stdout_and_greedy_is_deterministic(tiny_llama_path):
    """Run twice, the second time with steps overlapped (--async-scheduling): same texts."""
    stdin = "".join(json.dumps(r) + "\n" for r in GOOD)
    args = ["run", "-", "-o", "-", *tiny(tiny_llama_path)]
    first = pagedgen(*args, stdin=stdin)
    second = pagedgen(*args, "--async-scheduling", stdin=stdin)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    records = [json.loads(line) for line in first.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a", "b", "line-3"]
    texts = [r["text"] for r in records]
    assert texts == [json.loads(line)["text"] for line in second.stdout.splitlines()]


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "missing.jsonl", "-o", "-"], "not found"),
        (["run", "-", "-o", "-", "--model", "/no/such/model"], "does not exist"),
        (["run", "-", "-o", "-", "--temperature", "-1"], "temperature"),
        (["run", "-", "-o", "-", "--bogus"], "No such option: --bogus"),
        (["run", "-", "-o", "-", "--max-tokens", "x"], "--max-tokens"),
        (["run", "-", "-o", "-", "--order", "random"], "--order"),
        (["run", "-", "-o", "-", "--resume"], "--resume needs an output file"),
        (["run", "-", "-o", "-", "--input-format", "xml"], "input format"),
        (["run", "no/such-dataset", "-o", "-"], "neither a local file or folder nor a dataset"),
        (["profile", "-", "--block-sizes", "7"], "block sizes"),
        (["run", "-", "-o", "-", "--speculative-config", "{4}"], "--speculative-config"),
        (
            [
                "run",
                "-",
                "-o",
                "-",
                "--speculative-config",
                '{"method": "eagle", "num_speculative_tokens": 2}',
            ],
            "eagle",
        ),
        (
            ["run", "-", "-o", "-", "--async-scheduling", "--speculative-config", SPEC],
            "async_scheduling does not run with speculative decoding",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message, capsys):
    code, _, stderr = run_in_process(capsys, *args)
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.slow
def test_usage_error_in_a_subprocess_has_no_trace():
    result = pagedgen("run", "-", "-o", "-", "--bogus", stdin="")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: No such option: --bogus (see 'pagedgen run --help')"


def test_refuses_to_overwrite_records_without_resume_or_overwrite(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "line": 1, "error": null}\n')
    code, _, stderr = run_in_process(capsys, "run", "-", "-o", str(out))
    assert code == 2 and "--resume" in stderr and "--overwrite" in stderr
    assert out.read_text() == '{"id": "a", "line": 1, "error": null}\n'


def test_read_jsonl_reports_line_numbers():
    lines = ['{"prompt": "x"}\n', "\n", "[1, 2]\n", '{"messages": [{"role": "user"}]}\n']
    records = list(read_jsonl(iter(lines)))
    assert [r.line for r in records] == [1, 3, 4]
    assert records[0].error is None and records[0].prompt == "x"
    assert "JSON object" in records[1].error and "messages" in records[2].error


def test_logit_bias_per_line_and_out_of_vocabulary_ids(tiny_llama_path, capsys):
    """A line's logit_bias (JSON string keys) steers its tokens; one naming a token past the
    vocabulary becomes an error record, and the run exits 1."""
    from pagedgen import LLM, SamplingParams

    lines = [
        {"id": "a", "prompt": [5, 6, 7], "logit_bias": {"77": 100}},
        {"id": "b", "prompt": [5, 6, 7], "logit_bias": {"100000": 5}},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    args = ["run", "-", "-o", "-", *tiny(tiny_llama_path)]
    code, stdout, stderr = run_in_process(capsys, *args, stdin=stdin)
    assert code == 1, stderr
    a, b = (json.loads(line) for line in stdout.splitlines())
    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    params = SamplingParams(temperature=0, max_tokens=5, logit_bias={77: 100})
    [expected] = llm.generate([[5, 6, 7]], params)
    assert a["error"] is None and a["text"] == expected.outputs[0].text
    assert expected.outputs[0].token_ids == [77] * 5
    assert "logit_bias token id 100000 is outside the vocabulary" in b["error"]
    # the Python API's request fails alone too
    outside = SamplingParams(temperature=0, max_tokens=5, logit_bias={100000: 1})
    [rejected, fine] = llm.generate([[5, 6, 7]] * 2, [outside, params])
    assert "token 100000 is outside the vocabulary" in rejected.error
    assert fine.error is None and fine.outputs[0].token_ids == [77] * 5


def test_truncate_prompt_tokens_keeps_the_last_tokens(tiny_llama_path, capsys):
    """A line over max_model_len (512) runs with truncate_prompt_tokens, on its last k tokens:
    the same completion as those tokens alone; without it, the line fails."""
    from pagedgen import LLM, SamplingParams

    long_ids = [(7 * i) % 250 for i in range(600)]
    lines = [
        {"id": "ids", "prompt": long_ids, "truncate_prompt_tokens": 20},
        {"id": "text", "prompt": "many words " * 400, "truncate_prompt_tokens": 30},
        {"id": "untruncated", "prompt": long_ids},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    args = ["run", "-", "-o", "-", *tiny(tiny_llama_path)]
    code, stdout, stderr = run_in_process(capsys, *args, stdin=stdin)
    assert code == 1, stderr
    ids, text, untruncated = (json.loads(line) for line in stdout.splitlines())
    assert (ids["prompt_tokens"], text["prompt_tokens"]) == (20, 30)
    assert ids["error"] is None and text["error"] is None
    assert "exceed max_model_len" in untruncated["error"]
    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    greedy = SamplingParams(temperature=0, max_tokens=5)
    cut = SamplingParams(temperature=0, max_tokens=5, truncate_prompt_tokens=20)
    [alone], [truncated] = llm.generate([long_ids[-20:]], greedy), llm.generate([long_ids], cut)
    assert truncated.prompt_token_ids == long_ids[-20:]
    assert truncated.outputs[0].text == alone.outputs[0].text == ids["text"]


# The docs' one-liners (docs/cli.md): each prints one line per request.
JQ_ONE_LINERS = [
    "jq -c .text out.jsonl",
    "jq -c '[.outputs[].text]' out.jsonl",
    "jq -c '[.outputs[0].logprobs[]? | [.token, .logprob]]' out.jsonl",
    "jq -c '[.line, .finish_reason, .error]' out.jsonl",
]
RECORD_TYPES = {  # every key of a generation record, and the JSON types it may take
    "id": (str,),
    "line": (int,),
    "text": (str, type(None)),
    "finish_reason": (str,),
    "reasoning": (str, type(None)),
    "tool_calls": (list, type(None)),
    "outputs": (list,),
    "prompt_tokens": (int,),
    "completion_tokens": (int,),
    "prompt_logprobs": (list, type(None)),
    "time_to_first_token": (float, int, type(None)),
    "latency": (float, int, type(None)),
    "lora": (str, type(None)),
    "error": (str, type(None)),
    "request_hash": (str,),
}
COMPLETION_KEYS = {"index", "text", "finish_reason", "reasoning", "tool_calls", "logprobs"}
POSITION_KEYS = {"token_id", "token", "logprob", "rank", "top_logprobs"}


def test_every_record_has_one_shape_whatever_n_logprobs_or_error(tiny_llama_path, tmp_path, capsys):
    lines = [
        {"id": "one", "prompt": "hello there"},
        {"id": "two", "prompt": "hello there", "n": 2, "temperature": 1.0, "seed": 1},
        {"id": "bad", "prompt": ""},
        {"id": "lp", "prompt": [5, 6, 7], "logprobs": 2, "prompt_logprobs": 1},
        {"id": "lp2", "prompt": [5, 6, 7], "n": 2, "logprobs": 0, "temperature": 1.0, "seed": 2},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    args = ["run", "-", "-o", "-", *tiny(tiny_llama_path)]
    code, stdout, stderr = run_in_process(capsys, *args, stdin=stdin)
    assert code == 1, stderr  # the empty prompt failed
    records = {r["id"]: r for r in map(json.loads, stdout.splitlines())}
    assert list(records) == ["one", "two", "bad", "lp", "lp2"]
    for r in records.values():
        assert set(r) == set(RECORD_TYPES), r["id"]
        for key, types in RECORD_TYPES.items():
            assert isinstance(r[key], types), (r["id"], key)
        for i, completion in enumerate(r["outputs"]):
            assert set(completion) == COMPLETION_KEYS and completion["index"] == i
            assert isinstance(completion["text"], str)
        for completion in r["outputs"][:1]:  # the top-level fields are the first completion's
            assert (r["text"], r["finish_reason"]) == (
                completion["text"],
                completion["finish_reason"],
            )
    assert [len(r["outputs"]) for r in records.values()] == [1, 2, 0, 1, 2]
    bad = records["bad"]
    assert (bad["text"], bad["finish_reason"], bad["latency"]) == (None, "error", None)
    assert bad["error"] == "line 3: the prompt is empty"

    # logprobs: the sampled token and the K likeliest, each with id, text, logprob and rank
    steps = records["lp"]["outputs"][0]["logprobs"]
    assert len(steps) == 5
    for step in steps:
        assert set(step) == POSITION_KEYS and isinstance(step["token"], str)
        tops = step["top_logprobs"]
        assert [t["rank"] for t in tops] == [1, 2]
        assert all(set(t) == POSITION_KEYS - {"top_logprobs"} for t in tops)
        assert tops[0]["logprob"] >= tops[1]["logprob"]
        assert step["rank"] == 1 and step["token_id"] == tops[0]["token_id"]  # greedy
    prompt_steps = records["lp"]["prompt_logprobs"]
    assert prompt_steps[0] is None and [s["token_id"] for s in prompt_steps[1:]] == [6, 7]
    assert all(isinstance(s["rank"], int) for s in prompt_steps[1:])
    for completion in records["lp2"]["outputs"]:  # K = 0: the sampled token alone, ranked
        assert all(s["top_logprobs"] == [] for s in completion["logprobs"])
        assert all(isinstance(s["rank"], int) and s["rank"] >= 1 for s in completion["logprobs"])
        assert len(completion["logprobs"]) == 5
    for r in (records["one"], records["two"]):
        assert all(c["logprobs"] is None for c in r["outputs"])

    # the docs' jq one-liners print one line per request
    docs = (Path(__file__).parents[3] / "docs" / "cli.md").read_text()
    assert all(command in docs for command in JQ_ONE_LINERS)
    if shutil.which("jq") is None:
        return
    (tmp_path / "out.jsonl").write_text(stdout)
    for command in JQ_ONE_LINERS:
        printed = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert printed.returncode == 0, (command, printed.stderr)
        assert len(printed.stdout.splitlines()) == len(lines), command
