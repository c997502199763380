"""Workload files: `pagedgen bench --save-workload` writes the workload it ran, `--workload FILE`
runs one, and a bad file is one error line (exit 2)."""

import json

import pytest

from pagedgen.entrypoints.bench.workload_file import (
    WorkloadFileError,
    check_workload,
    read_workload,
    save_workload,
)
from pagedgen.entrypoints.bench.workloads import Workload
from tests.cli_util import run_in_process

WORKLOAD = Workload("test", [[1, 2, 3], [4, 5]], [3, 2], "token ids")
FAST = ["--baselines", "static32", "--kv-cache-memory", "0.01", "--no-roofline", "--no-overhead"]


def bench(capsys, model, *args: str) -> tuple[int, str]:
    code, _, stderr = run_in_process(capsys, "bench", "--model", str(model), *FAST, *args)
    return code, stderr


def test_save_and_read_round_trip(tmp_path):
    path = tmp_path / "w.json"
    save_workload(WORKLOAD, path)
    assert json.loads(path.read_text()) == {"prompts": [[1, 2, 3], [4, 5]], "max_tokens": [3, 2]}
    loaded = read_workload(path)
    assert (loaded.prompts, loaded.max_tokens, loaded.name) == (WORKLOAD.prompts, [3, 2], "w")
    check_workload(loaded, vocab_size=6, max_model_len=6)


@pytest.mark.slow
def test_a_saved_workload_runs_the_same_requests(tiny_llama_path, tmp_path, capsys):
    saved, first, second = tmp_path / "fixed.json", tmp_path / "a.json", tmp_path / "b.json"
    args = ["--workload", "fixed", "--num-prompts", "3", "--input-len", "8", "--output-len", "3"]
    code, stderr = bench(
        capsys, tiny_llama_path, *args, "--save-workload", str(saved), "--output-json", str(first)
    )
    assert code == 0, stderr
    data = json.loads(saved.read_text())
    assert len(data["prompts"]) == 3 and data["max_tokens"] == [3, 3, 3]
    code, stderr = bench(
        capsys, tiny_llama_path, "--workload", str(saved), "--output-json", str(second)
    )
    assert code == 0, stderr
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert b["workload"]["name"] == "fixed"
    assert b["workload"]["prompt_format"] == "token ids from fixed.json"
    for key in ("num_requests", "num_prompt_tokens", "num_output_tokens"):
        assert a["workload"][key] == b["workload"][key]
    assert b["agreement"]["static32"]["num_identical_requests"] == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("{nope", "is not JSON"),
        ("[[1, 2]]", 'must be an object {"prompts"'),
        ('{"prompts": [[1, 2]], "max_tokens": [1, 2]}', "1 prompts but 2 max_tokens"),
        ('{"prompts": [[]], "max_tokens": [1]}', "prompt 0 is not a non-empty list"),
        ('{"prompts": [[1, -1]], "max_tokens": [1]}', "prompt 0 is not a non-empty list"),
        ('{"prompts": [[1, "a"]], "max_tokens": [1]}', "prompt 0 is not a non-empty list"),
        ('{"prompts": [[1], [2]], "max_tokens": [1, 0]}', "max_tokens 1 is 0, not >= 1"),
        ('{"prompts": [[1]], "max_tokens": [true]}', "max_tokens 0 is True"),
        ('{"prompts": [], "max_tokens": []}', "must be lists"),
    ],
)
def test_a_bad_file_is_one_error_line_before_the_model_loads(
    tiny_llama_path, tmp_path, capsys, content, message
):
    path = tmp_path / "w.json"
    if content is not None:
        path.write_text(content)
    code, stderr = bench(capsys, tiny_llama_path, "--workload", str(path))
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines() == [stderr.strip()], stderr  # nothing loaded, one line


@pytest.mark.parametrize(
    ("prompts", "max_tokens", "message"),
    [
        ([[1, 2], [3, 257]], [1, 1], "prompt 1 holds token id 257, outside the model's vocabulary"),
        ([[1, 2]], [511], "request 0 needs 2 + 511 tokens, more than max_model_len 512"),
    ],
)
def test_a_file_that_does_not_fit_the_model_is_refused(
    tiny_llama_path, tmp_path, capsys, prompts, max_tokens, message
):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"prompts": prompts, "max_tokens": max_tokens}))
    code, stderr = bench(capsys, tiny_llama_path, "--workload", str(path))
    assert code == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert message in last and last.startswith("error:") and "Traceback" not in stderr, stderr


def test_workload_names_that_are_not_files_are_refused(capsys, tiny_llama_path, tmp_path):
    code, stderr = bench(capsys, tiny_llama_path, "--workload", "nope")
    assert code == 2 and "workload must be one of" in stderr and "or a workload .json" in stderr
    code, stderr = bench(
        capsys, tiny_llama_path, "--save-workload", str(tmp_path / "no" / "such" / "w.json")
    )
    assert code == 2 and "no such folder" in stderr, stderr


def test_an_unwritable_save_path_is_a_workload_file_error(tmp_path):
    with pytest.raises(WorkloadFileError, match="cannot write the workload file"):
        save_workload(WORKLOAD, tmp_path)  # a folder
