import json
import subprocess
import sys

import pytest

from pagedgen.cli.inputs import read_jsonl

GOOD = [
    {"id": "a", "prompt": "hello there"},
    {"id": "b", "messages": [{"role": "user", "content": "hi"}]},
    {"prompt": [5, 6, 7]},
]


def pagedgen(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pagedgen.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def common(model) -> list[str]:
    return ["--model", str(model), "--kv-cache-memory", "0.01", "--max-tokens", "5"]


def test_run_writes_one_record_per_line_in_order(tiny_llama_path, tmp_path):
    lines = [json.dumps(GOOD[0]), "{not json", json.dumps(GOOD[1]), '{"prompt": ""}']
    lines += [json.dumps(GOOD[2]), '{"id": "x", "prompt": "a", "messages": []}']
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    result = pagedgen("run", str(src), "-o", str(out), *common(tiny_llama_path))
    assert result.returncode == 1, result.stderr  # some lines failed
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "line-2", "b", "line-4", "line-5", "x"]
    errors = {r["id"]: r["error"] for r in records if r["error"]}
    assert set(errors) == {"line-2", "line-4", "x"}
    assert errors["line-2"].startswith("line 2: invalid JSON")
    assert errors["x"].startswith("line 6:")
    for r in records:
        if not r["error"]:
            assert r["completion_tokens"] == 5 and r["finish_reason"] in ("length", "stop")
            assert r["prompt_tokens"] > 0 and isinstance(r["text"], str)
    assert "3 failed" in result.stderr


def test_stdin_to_stdout_and_greedy_is_deterministic(tiny_llama_path):
    stdin = "".join(json.dumps(r) + "\n" for r in GOOD)
    args = ["run", "-", "-o", "-", "--temperature", "0", *common(tiny_llama_path)]
    first, second = pagedgen(*args, stdin=stdin), pagedgen(*args, stdin=stdin)
    assert first.returncode == 0, first.stderr
    records = [json.loads(line) for line in first.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a", "b", "line-3"]
    texts = [r["text"] for r in records]
    assert texts == [json.loads(line)["text"] for line in second.stdout.splitlines()]


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "missing.jsonl", "-o", "-"], "not found"),
        (["run", "-", "-o", "-", "--model", "/no/such/model"], "neither a local folder"),
        (["run", "-", "-o", "-", "--temperature", "-1"], "temperature"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    result = pagedgen(*args, stdin="")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_read_jsonl_reports_line_numbers():
    lines = ['{"prompt": "x"}\n', "\n", "[1, 2]\n", '{"messages": [{"role": "user"}]}\n']
    records = list(read_jsonl(iter(lines)))
    assert [r.line_number for r in records] == [1, 3, 4]
    assert records[0].error is None and records[0].prompt == "x"
    assert "JSON object" in records[1].error and "messages" in records[2].error
