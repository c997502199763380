"""User mistakes: one line, exit 2, no traceback, found before the model loads where they can be,
and no output left behind; bad values in one input line fail that line alone."""

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from tests.cli_util import COMMAND, ENV, read_records, run_in_process, tiny, write_jsonl


@pytest.fixture
def src(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"question {i}"} for i in range(3)])


def assert_usage_error(code: int, stderr: str, message: str) -> None:
    assert code == 2, stderr[-2000:]
    assert message in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kv-cache-memory", "100000"], "GiB of memory available"),
        (["--device", "cuda"], "torch sees no CUDA GPU"),
        (["--attention-backend", "cupy"], "--attention-backend cupy runs on a CUDA GPU"),
        (["--stats-json", "no/such/folder/stats.json"], "folder 'no/such/folder' does not exist"),
        (["--model", "/nonexistent"], "model path '/nonexistent' does not exist"),
        (["--model", "./models/none"], "model path './models/none' does not exist"),
        (["--block-size", "7"], "--block-size"),
        (["--temperature", "inf"], "temperature must be a finite number"),
        (["--swap-space", "nan"], "--swap-space must be a finite number"),
        (
            ["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %"],
            "--chat-template: Jinja syntax error on line 1: expected token 'end of statement",
        ),
    ],
)
def test_mistakes_fail_before_the_model_loads_and_leave_no_output(
    tiny_llama_path, src, tmp_path, monkeypatch, capsys, args, message
):
    if torch.cuda.is_available() and "cuda" in message.lower():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.jsonl"
    options = [*tiny(tiny_llama_path), *args]  # the last of an option given twice wins
    code, _, stderr = run_in_process(capsys, "run", str(src), "-o", str(out), *options)
    assert_usage_error(code, stderr, message)
    assert "huggingface-cli" not in stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_mistake_found_after_the_claim_leaves_the_old_output(tiny_llama_path, src, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "line": 1, "error": null}\n')
    kv = ["--kv-cache-memory", "0.000001"]  # holds no block: found when the model is loaded
    result = subprocess.run(
        [*COMMAND, "run", str(src), "-o", str(out), *tiny(tiny_llama_path), *kv, "--overwrite"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "error:" in result.stderr
    assert out.read_text() == '{"id": "a", "line": 1, "error": null}\n'


@pytest.mark.slow
def test_the_input_as_output_is_refused_whatever_the_flags(tiny_llama_path, src, tmp_path, capsys):
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    for output, flags in ((src, ["--overwrite"]), (tmp_path / "link.jsonl", ["--resume"])):
        code, _, stderr = run_in_process(
            capsys, "run", str(src), "-o", str(output), *tiny(tiny_llama_path), *flags
        )
        assert_usage_error(code, stderr, "is the input")
    with src.open("rb") as stdin:
        result = subprocess.run(
            [*COMMAND, "run", "-", "-o", str(src), "--overwrite", *tiny(tiny_llama_path)],
            stdin=stdin,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=300,
        )
    assert_usage_error(result.returncode, result.stderr, "is the input")
    assert src.read_bytes() == before


def test_resume_refuses_an_output_made_from_another_input_without_ids(
    tiny_llama_path, tmp_path, capsys
):
    first = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"tell me about {i}"} for i in range(8)])
    other = write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"name a color {i}"} for i in range(8)])
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(first), "-o", str(out), *tiny(tiny_llama_path)
    )
    assert code == 0, stderr
    out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:5]))
    kept = out.read_bytes()
    args = ["-o", str(out), *tiny(tiny_llama_path), "--resume"]
    code, _, stderr = run_in_process(capsys, "run", str(other), *args)
    assert_usage_error(code, stderr, "does not answer this input")
    assert out.read_bytes() == kept
    code, _, stderr = run_in_process(capsys, "run", str(first), *args)
    assert code == 0, stderr
    assert [r["line"] for r in read_records(out)] == list(range(1, 9))


def test_bad_values_in_a_line_fail_that_line(tiny_llama_path, tmp_path, capsys):
    lines = [
        b'{"prompt": "a", "temperature": Infinity}',
        b'{"prompt": "a", "top_p": NaN}',
        b'{"prompt": "a", "repetition_penalty": 1e999}',
        b'{"prompt": "a", "stop_token_ids": [257]}',  # the tiny vocabulary is 0..256
        b'{"prompt": "a", "stop_token_ids": [-1]}',
        b'{"prompt": "a", "stop_token_ids": [256]}',
    ]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(src), "-o", str(out), *tiny(tiny_llama_path)
    )
    assert code == 1, stderr
    errors = [r["error"] for r in read_records(out)]
    assert errors[0] == "line 1: 'temperature' must be a finite number, got inf"
    assert errors[1] == "line 2: 'top_p' must be a finite number, got nan"
    assert errors[2] == "line 3: 'repetition_penalty' must be a finite number, got inf"
    assert errors[3] == "line 4: stop token id 257 is outside the vocabulary (0..256)"
    assert errors[4] == "line 5: stop token id -1 is outside the vocabulary (0..256)"
    assert errors[5] is None


def test_a_line_too_long_for_the_model_is_rejected_without_tokenizing(
    tiny_llama_path, tmp_path, capsys, monkeypatch
):
    from transformers import PreTrainedTokenizerFast

    encode = PreTrainedTokenizerFast.encode
    lengths: list[int] = []

    def counting_encode(self, text, *args, **kwargs):
        lengths.append(len(text))
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerFast, "encode", counting_encode)
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "word " * 1_000_000}, {"prompt": "hi"}])
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(src), "-o", str(out), *tiny(tiny_llama_path)
    )
    assert code == 1, stderr
    big, small = read_records(out)
    assert big["error"] == (
        "line 1: the prompt's 5,000,000 bytes are more than max_model_len (512) tokens can hold"
    )
    assert small["error"] is None
    assert max(lengths) < 1000  # the long prompt never reached the tokenizer


def test_help_reads_at_80_columns_and_explains_every_option(capsys, monkeypatch):
    from typer.main import get_command

    from pagedgen.entrypoints.cli.main import app

    monkeypatch.setenv("COLUMNS", "80")
    group = get_command(app)
    code, stdout, _ = run_in_process(capsys, "--help")
    assert code == 0 and "..." not in stdout.split("Commands:")[1]
    for name in ("run", "profile", "bench"):
        code, stdout, _ = run_in_process(capsys, name, "--help")
        assert code == 0
        assert max(map(len, stdout.splitlines())) <= 80, stdout
        assert "…" not in stdout and "..." not in stdout
        assert name == "bench" or "--kv-cache-memory GIB" in stdout
        undocumented = [p.name for p in group.commands[name].params if not getattr(p, "help", "x")]
        assert undocumented == [], (name, undocumented)


def test_the_readme_demo_runs_twice(tiny_llama_path, tmp_path, monkeypatch, capsys):
    readme = Path("README.md").read_text()
    setup = readme[readme.index("```bash") + 8 :].split("\n```", 1)[0]
    command = shlex.split(setup.split("&&")[-1])
    assert command[:2] == ["pagedgen", "run"] and "--temperature" in command
    src = Path("examples/prompts.jsonl").resolve()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "prompts.jsonl").write_bytes(src.read_bytes())
    for _ in range(2):
        code, _, stderr = run_in_process(capsys, *command[1:], *tiny(tiny_llama_path, 2))
        assert code == 0, stderr
    api = readme[readme.index("## Python") :]
    example = api[api.index("```python") :].split("\n```", 1)[0]
    assert example.splitlines()[-1].startswith("print(")  # the chat result too


def test_stats_json_is_neither_the_input_nor_the_output(
    tiny_llama_path, src, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.jsonl"
    (tmp_path / "link.jsonl").symlink_to(out)
    before = src.read_bytes()
    for stats, message in (("./in.jsonl", "is the input"), ("out.jsonl", "is the output")):
        args = ["run", "in.jsonl", "-o", "out.jsonl", *tiny(tiny_llama_path), "--stats-json"]
        code, _, stderr = run_in_process(capsys, *args, stats)
        assert_usage_error(code, stderr, f"--stats-json {stats!r} {message}")
        assert not out.exists()
    out.write_text('{"id": "a", "line": 1, "error": null}\n')
    args = ["run", str(src), "-o", str(out), *tiny(tiny_llama_path), "--overwrite"]
    code, _, stderr = run_in_process(capsys, *args, "--stats-json", "link.jsonl")
    assert_usage_error(code, stderr, "--stats-json 'link.jsonl' is the output")
    assert out.read_text() == '{"id": "a", "line": 1, "error": null}\n'
    assert src.read_bytes() == before


def test_stats_json_dash_is_stdout_unless_the_records_go_there(
    tiny_llama_path, src, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    args = ["run", str(src), *tiny(tiny_llama_path), "--stats-json", "-"]
    code, stdout, stderr = run_in_process(capsys, *args, "-o", "-")
    assert_usage_error(code, stderr, "--stats-json - and -o - both write to stdout")
    assert stdout == ""
    code, stdout, stderr = run_in_process(capsys, *args, "-o", "out.jsonl")
    assert code == 0, stderr
    assert json.loads(stdout)["num_requests"] == 3
    assert len(read_records(tmp_path / "out.jsonl")) == 3
    assert not (tmp_path / "-").exists()
