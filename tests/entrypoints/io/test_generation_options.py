"""The generation options kept beside an output, without a model: written with the first record,
checked by a resume before anything is written, for an output file and a parts folder alike."""

import json
from pathlib import Path

import pytest

from pagedgen.entrypoints.io import InputError, OutputFile
from pagedgen.entrypoints.io.generation_options import GenerationOptions, options_path
from pagedgen.entrypoints.io.parts import PartsOutput
from pagedgen.sampling_params import StructuredOutputsParams

RECORD = b'{"id": "a", "line": 1, "error": null}\n'
GREEDY = GenerationOptions({"--model": "m", "--temperature": 0.0, "--stop": None})
WARM = GenerationOptions({"--model": "m", "--temperature": 0.9, "--stop": None})


def test_the_digest_follows_the_values_not_their_order():
    same = GenerationOptions({"--stop": None, "--temperature": 0.0, "--model": "m"})
    assert same.digest == GREEDY.digest != WARM.digest
    assert WARM.first_difference(GREEDY.options) == ("--temperature", 0.0, 0.9)
    assert GREEDY.first_difference({**GREEDY.options, "--seed": 1}) == ("--seed", 1, None)
    assert GREEDY.first_difference(dict(GREEDY.options)) is None


def test_values_are_kept_as_json():
    options = GenerationOptions({"--choice": StructuredOutputsParams(choice=["a", "b"])})
    assert options.options == {"--choice": {"choice": ["a", "b"]}}
    json.dumps(options.options)


def write_output(path: Path, options: GenerationOptions) -> None:
    output = OutputFile(str(path), overwrite=True, options=options)
    output.stream.write(RECORD)
    output.close()


def test_an_output_file_is_resumed_only_under_its_options(tmp_path):
    out = tmp_path / "out.jsonl"
    write_output(out, GREEDY)
    kept = Path(options_path(str(out))).read_bytes()
    assert json.loads(kept)["options"] == GREEDY.options
    with pytest.raises(InputError, match=r"--temperature 0\.0, this run has 0\.9"):
        OutputFile(str(out), resume=True, options=WARM)
    assert out.read_bytes() == RECORD and Path(options_path(str(out))).read_bytes() == kept
    resumed = OutputFile(str(out), resume=True, options=GREEDY)
    assert resumed.note is None and list(resumed.state.done) == [1]
    resumed.close()


def test_an_output_without_kept_options_is_resumed_with_a_note(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(RECORD)
    resumed = OutputFile(str(out), resume=True, options=WARM)
    assert "holds no record of the options" in resumed.note
    resumed.stream.write(b'{"id": "b", "line": 2, "error": null}\n')
    resumed.close()
    assert json.loads(Path(options_path(str(out))).read_text())["digest"] == WARM.digest


def test_options_are_written_with_the_first_record_and_removed_with_an_empty_output(tmp_path):
    out = tmp_path / "out.jsonl"
    claimed = OutputFile(str(out), options=GREEDY)
    assert not Path(options_path(str(out))).exists()  # claiming writes nothing
    claimed.stream  # noqa: B018
    assert Path(options_path(str(out))).exists()
    claimed.close(keep=False)  # the run failed before its first record
    assert not out.exists() and not Path(options_path(str(out))).exists()


def test_a_parts_folder_is_resumed_only_under_its_options(tmp_path):
    folder = tmp_path / "parts"
    parts = PartsOutput(str(folder), options=GREEDY)
    parts.stream.write(RECORD)
    parts.close()
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert "options.json" in before
    with pytest.raises(InputError, match="--temperature"):
        PartsOutput(str(folder), resume=True, options=WARM)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    resumed = PartsOutput(str(folder), resume=True, options=GREEDY)
    assert list(resumed.state.done) == [1]
    resumed.close(keep=False)


def test_a_long_value_is_elided_in_the_message(tmp_path):
    out = tmp_path / "out.jsonl"
    write_output(out, GenerationOptions({"--chat-template": "{{ messages }}" * 20}))
    with pytest.raises(
        InputError, match=r"--chat-template \"\{\{ messages \}\}.*\.\.\., this run has null"
    ) as e:
        OutputFile(str(out), resume=True, options=GenerationOptions({"--chat-template": None}))
    shown = str(e.value).split("--chat-template ", 1)[1].split(", this run has", 1)[0]
    assert len(shown) < 100 < len("{{ messages }}" * 20)
