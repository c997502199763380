"""--resume refuses to mix records made under other generation options; an empty input and an
output that cannot be written end the run before the model loads."""

import json
import os
from pathlib import Path

import pytest

import pagedgen as pagedgen_package
from tests.cli_util import read_records, run_in_process, tiny, write_jsonl

PROMPTS = [{"id": f"p{i}", "prompt": f"prompt number {i}"} for i in range(4)]


def run_args(model: Path, src: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(src), "-o", str(out), *tiny(model, max_tokens=4), *extra]


@pytest.fixture
def interrupted(tiny_llama_path, tmp_path, capsys) -> tuple[Path, Path, list[dict]]:
    """An input, an output holding the first of its records (as a stopped run leaves it) and
    the records of the whole run."""
    src = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(capsys, *run_args(tiny_llama_path, src, out))
    assert code == 0, stderr
    reference = read_records(out)
    out.write_text(out.read_text().splitlines(keepends=True)[0])
    return src, out, reference


def options_file(out: Path) -> Path:
    return Path(f"{out}.options.json")


def no_model(*args, **kwargs):
    raise AssertionError("the model was loaded")


def test_the_options_are_kept_beside_the_output(interrupted):
    _, out, _ = interrupted
    kept = json.loads(options_file(out).read_text())
    assert kept["digest"].startswith("sha256:")
    assert kept["options"]["--temperature"] == 0.0 and kept["options"]["--max-tokens"] == 4
    assert kept["options"]["--input-format"] == "jsonl"
    assert "--max-num-seqs" not in kept["options"] and "--device" not in kept["options"]


def test_resume_with_another_temperature_exits_2_leaving_the_output(
    tiny_llama_path, interrupted, capsys, monkeypatch
):
    src, out, _ = interrupted
    before, kept = out.read_bytes(), options_file(out).read_bytes()
    monkeypatch.setattr(pagedgen_package, "LLM", no_model)
    args = run_args(tiny_llama_path, src, out, "--temperature", "0.9", "--resume")
    code, _, stderr = run_in_process(capsys, *args)
    assert code == 2
    assert "--temperature 0.0, this run has 0.9" in stderr and str(out) in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert out.read_bytes() == before and options_file(out).read_bytes() == kept


@pytest.mark.parametrize("extra", [(), ("--max-num-seqs", "1", "--no-enable-prefix-caching")])
def test_resume_with_the_same_generation_options_continues(
    tiny_llama_path, interrupted, capsys, extra
):
    """Options that change how, not what, is generated (batch size, prefix caching) may
    differ."""
    src, out, reference = interrupted
    code, _, stderr = run_in_process(
        capsys, *run_args(tiny_llama_path, src, out, *extra, "--resume")
    )
    assert code == 0, stderr
    assert "1 records kept" in stderr
    assert [(r["id"], r["text"]) for r in read_records(out)] == [
        (r["id"], r["text"]) for r in reference
    ]


def test_resume_of_an_output_without_options_notes_it_and_keeps_them(
    tiny_llama_path, interrupted, capsys
):
    src, out, reference = interrupted
    options_file(out).unlink()  # as an older pagedgen left it
    code, _, stderr = run_in_process(capsys, *run_args(tiny_llama_path, src, out, "--resume"))
    assert code == 0, stderr
    assert "holds no record of the options" in stderr
    assert len(read_records(out)) == len(reference)
    assert json.loads(options_file(out).read_text())["options"]["--max-tokens"] == 4


def test_an_empty_input_exits_0_without_loading_the_model(
    tiny_llama_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(pagedgen_package, "LLM", no_model)
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(capsys, *run_args(tiny_llama_path, src, out))
    assert code == 0, stderr
    assert "holds no records" in stderr and out.read_bytes() == b""
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *tiny(tiny_llama_path), stdin=b""
    )
    assert code == 0 and stdout == "", stderr


def unwritable_outputs(tmp_path: Path) -> list[tuple[list[str], str, str]]:
    """(the output options, the path the message names, the reason it gives)"""
    missing = str(tmp_path / "no" / "such" / "out.jsonl")
    cases = [(["-o", missing], missing, f"folder {str(tmp_path / 'no' / 'such')!r}")]
    if os.path.exists("/proc/version"):
        cases.append((["-o", "/proc/version", "--overwrite"], "/proc/version", ""))
    if os.geteuid() != 0:  # root writes a read-only file
        read_only = tmp_path / "read-only.jsonl"
        read_only.write_text("")
        read_only.chmod(0o444)
        cases.append((["-o", str(read_only)], str(read_only), "Permission denied"))
    return cases


def test_an_output_that_cannot_be_written_exits_2_before_the_model_loads(
    tiny_llama_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(pagedgen_package, "LLM", no_model)
    src = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    for output, path, reason in unwritable_outputs(tmp_path):
        args = ["run", str(src), *output, *tiny(tiny_llama_path)]
        code, _, stderr = run_in_process(capsys, *args)
        assert code == 2, stderr
        [line] = stderr.strip().splitlines()
        assert line.startswith(f"error: cannot write output {path!r}: ") and reason in line
        assert "Errno" not in line


def test_the_model_revision_and_tokenizer_are_generation_options():
    """A snapshot or tokenizer of another revision generates other tokens: --resume checks them."""
    from pagedgen.config import EngineConfig
    from pagedgen.entrypoints.cli.run_job import RunOptions, generation_options
    from pagedgen.entrypoints.io import InputSpec

    def values(**engine):
        options = RunOptions(InputSpec("in.jsonl"), "out.jsonl", EngineConfig(**engine), {})
        return generation_options(options, "jsonl").options

    assert values()["--revision"] is None and values()["--tokenizer"] is None
    assert values(revision="v2")["--revision"] == "v2"
    assert values(tokenizer="./tok")["--tokenizer"] == "./tok"
