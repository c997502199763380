"""Input readers, without a model: every format, and every way a line can be bad."""

import json

import pytest

from pagedgen.entrypoints.io.openai_batch import parse_openai
from pagedgen.entrypoints.io.readers import detect_format, open_input, read_jsonl, read_text
from pagedgen.entrypoints.io.records import parse_native
from pagedgen.entrypoints.io.spec import InputError, InputSpec


def records_of(lines: list[bytes]):
    return list(read_jsonl(iter(lines)))


def test_native_lines_carry_prompt_messages_id_and_sampling_overrides():
    lines = [
        b'{"id": 7, "prompt": "hi", "temperature": 0, "stop": ["x"], "max_tokens": 3}\n',
        b'{"messages": [{"role": "user", "content": "yo"}], "n": 2, "seed": null}\n',
        b'{"prompt": [1, 2, 3], "unknown_field": 1, "idx": 4, "category": "a"}\n',
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},'
        b' {"type": "text", "text": "b"}]}]}\n',
    ]
    a, b, c, d = records_of(lines)
    assert d.error is None and d.messages == [{"role": "user", "content": "a\nb"}]
    assert (a.id, a.prompt, a.sampling) == ("7", "hi", {"temperature": 0, "stop": ["x"],
                                                         "max_tokens": 3})  # fmt: skip
    assert b.messages == [{"role": "user", "content": "yo"}] and b.sampling == {
        "n": 2,
        "seed": None,
    }
    assert (c.id, c.prompt, c.sampling, c.error) == ("line-3", [1, 2, 3], {}, None)


@pytest.mark.parametrize(
    "line,error",
    [
        (b"{not json", "invalid JSON"),
        (b'"a string"', "must be a JSON object, got a string"),
        (b"[1, 2]", "must be a JSON object, got a list"),
        (b"{}", "exactly one of 'prompt' and 'messages'"),
        (b'{"prompt": "a", "messages": []}', "exactly one of"),
        (b'{"prompt": ""}', "the prompt is empty"),
        (b'{"prompt": []}', "empty list of token ids"),
        (b'{"prompt": 5}', "'prompt' must be a string or a list of token ids, got the number 5"),
        (b'{"prompt": [1, "a"]}', "'prompt' must be a string or a list of token ids"),
        (b'{"prompt": [1, true]}', "'prompt' must be a string or a list of token ids"),
        (b'{"messages": "hi"}', "'messages' must be a non-empty list"),
        (b'{"messages": [{"role": "user"}]}', "messages[0] must be an object"),
        (b'{"messages": [{"role": "user", "content": 3}]}', "messages[0]"),
        (b'{"prompt": "a", "temperature": "hot"}', "'temperature' must be a float, got a string"),
        (b'{"prompt": "a", "max_tokens": 1.5}', "'max_tokens' must be a int or null"),
        (b'{"prompt": "a", "n": true}', "'n' must be a int, got a boolean"),
        (b'{"prompt": "a", "stop": 5}', "'stop' must be a string or list of strings"),
        (b'{"prompt": "a", "stop_token_ids": [1.5]}', "'stop_token_ids'"),
        (b'{"id": [1], "prompt": "a"}', "'id' must be a string or an integer, got a list"),
        (b'{"prompt": "bad \xff bytes"}', "undecodable bytes: not UTF-8"),
        (b'{"prompt": "a", "temprature": 0}', "unknown field 'temprature'; did you mean 'tempe"),
        (b'{"message": [{"role": "user", "content": "a"}]}', "did you mean 'messages'?"),
        (b'{"prompt": "a", "max_token": 4, "source": "web"}', "did you mean 'max_tokens'?"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            "messages[0]: only text content parts are supported",
        ),
    ],
)
def test_a_bad_line_becomes_an_error_naming_the_reason(line, error):
    (record,) = records_of([b'{"prompt": "ok"}\n', b"\n", line + b"\n"])[1:]
    assert record.line == 3 and error in record.error, record.error


def test_bom_and_blank_lines_and_text_format():
    (record,) = records_of([b'\xef\xbb\xbf{"prompt": "x"}\n'])
    assert record.prompt == "x"
    text = list(read_text(iter([b"first\r\n", b"   \n", b"third\n", b"\xff\n"])))
    assert [(r.line, r.prompt) for r in text[:2]] == [(1, "first"), (3, "third")]
    assert text[2].line == 4 and "undecodable" in text[2].error


def test_openai_requests_map_body_parameters():
    chat = parse_openai(
        {
            "custom_id": "c1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "ignored",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "text", "text": "b"}]}],
                "max_completion_tokens": 9,
                "logprobs": True,
                "top_logprobs": 2,
                "stop": "\n",
                "n": 2,
                "seed": 4,
                "top_p": 0.5,
            },
        },
        1,
    )  # fmt: skip
    assert chat.error is None and chat.endpoint == "chat" and chat.id == "c1"
    assert chat.messages == [{"role": "user", "content": "a\nb"}]  # as vLLM joins text parts
    assert chat.sampling == {"max_tokens": 9, "logprobs": 2, "stop": "\n", "n": 2, "seed": 4,
                             "top_p": 0.5}  # fmt: skip
    completion = parse_openai(
        {"custom_id": "c2", "url": "/v1/completions", "body": {"prompt": "x", "logprobs": 3}}, 2
    )
    assert completion.endpoint == "completions" and completion.sampling == {"logprobs": 3}
    bad = {
        "custom_id": None,
        "url": "/v1/moderations",
    }
    assert "custom_id" in parse_openai(bad, 3).error
    assert "'url' must be one of" in parse_openai({**bad, "custom_id": "x"}, 3).error
    no_body = {"custom_id": "x", "url": "/v1/completions"}
    assert "'body' must be an object" in parse_openai(no_body, 4).error
    many = {**no_body, "body": {"prompt": ["a", "b"]}}
    assert "one request per prompt" in parse_openai(many, 5).error
    get = {**no_body, "method": "GET", "body": {"prompt": "a"}}
    assert "POST" in parse_openai(get, 6).error


@pytest.mark.parametrize(
    "field,value",
    [("functions", [{"name": "f"}]), ("function_call", "f"), ("stream", True),
     ("echo", True), ("suffix", "end"), ("best_of", 3), ("modalities", ["text", "audio"])],
)  # fmt: skip
def test_openai_parameters_that_change_the_answer_fail_the_request(field, value):
    """Never dropped unseen: the request becomes an error record naming the parameter; their
    defaults and labels (model, user, metadata) pass."""
    body = {"prompt": "x", "model": "m", "user": "u", "metadata": {"k": "v"}, field: value}
    request = {"custom_id": "c", "url": "/v1/completions", "body": body}
    assert f"'{field}' is not supported" in parse_openai(request, 1).error
    fine = {**body, field: None, "tool_choice": "none", "stream": False, "best_of": 1}
    assert parse_openai({**request, "body": fine}, 1).error is None


@pytest.mark.parametrize(
    "body,message",
    [({"prompt": "x", "temprature": 0.5}, "'temprature'; did you mean 'temperature'?"),
     ({"prompt": "x", "max_token": 5}, "did you mean 'max_tokens'?"),
     ({"prompt": "x", "top_logprob": 2}, "did you mean 'top_logprobs'?")],
)  # fmt: skip
def test_near_misses_in_an_openai_body_fail_their_line(body, message):
    request = {"custom_id": "c", "url": "/v1/completions", "body": body}
    assert message in parse_openai(request, 1).error


def test_format_detection_and_openai_peek(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text(
        "garbage\n"
        + json.dumps({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}})
        + "\n"
    )
    source = open_input(InputSpec(str(path)))
    assert source.format == "openai" and source.total == 2
    first, second = source.records
    assert "invalid JSON" in first.error and second.id == "a"
    text = tmp_path / "p.txt"
    text.write_text("one\ntwo\n")
    source = open_input(InputSpec(str(text), limit=1))
    assert source.format == "text" and [r.prompt for r in source.records] == ["one"]
    with pytest.raises(InputError, match="not found"):
        open_input(InputSpec(str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="not both"):
        InputSpec("x", prompt_column="a", messages_column="b")


@pytest.fixture(scope="module")
def dataset_files(tmp_path_factory):
    import datasets

    datasets.disable_progress_bars()
    folder = tmp_path_factory.mktemp("datasets")
    rows = {
        "question": ["a", "b", None, "d"],
        "chat": [[{"role": "user", "content": c}] for c in "wxyz"],
        "qid": [10, 11, 12, 13],
        "answer": ["one two", "three", "", "four five six"],
    }
    ds = datasets.Dataset.from_dict(rows)
    ds.save_to_disk(folder / "saved")
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(folder / "dict")
    ds.to_parquet(folder / "rows.parquet")
    ds.to_csv(folder / "rows.csv")
    return folder


def test_save_to_disk_folder_with_columns(dataset_files):
    spec = InputSpec(str(dataset_files / "saved"), id_column="qid", reference_column="answer")
    source = open_input(spec)
    assert source.format == "dataset" and source.total == 4
    records = list(source.records)
    assert [r.id for r in records] == ["10", "11", "12", "13"]
    assert [r.prompt for r in records] == ["a", "b", None, "d"]
    assert records[2].error == "column 'question' is null" and records[2].where == "row 3"
    assert records[3].reference == "four five six" and records[0].line == 1
    chats = list(
        open_input(InputSpec(str(dataset_files / "saved"), messages_column="chat")).records
    )
    assert chats[1].messages == [{"role": "user", "content": "x"}] and chats[1].id == "row-2"
    test_split = open_input(InputSpec(str(dataset_files / "dict"), split="test"))
    assert test_split.total == 1
    with pytest.raises(InputError, match="split 'dev'"):
        open_input(InputSpec(str(dataset_files / "dict"), split="dev"))


def test_parquet_and_csv_files_stream(dataset_files):
    source = open_input(InputSpec(str(dataset_files / "rows.parquet"), limit=2))
    assert source.total == 2 and [r.prompt for r in source.records] == ["a", "b"]
    source = open_input(InputSpec(str(dataset_files / "rows.csv"), prompt_column="answer"))
    assert [r.prompt for r in source.records][:2] == ["one two", "three"]
    with pytest.raises(InputError, match="column 'nope' is not in the dataset"):
        open_input(InputSpec(str(dataset_files / "rows.parquet"), prompt_column="nope"))


def test_hub_id_reads_the_local_cache_offline(tmp_path, monkeypatch, dataset_files):
    """A hub dataset cached by an earlier online load_dataset: the same layout, built offline."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    builder = Parquet(
        cache_dir=str(cache),
        dataset_name="tiny_prompts",
        data_files={"train": str(dataset_files / "rows.parquet")},
        hash="0123abcd",
    )
    builder.download_and_prepare()
    built = next((cache / "tiny_prompts").iterdir())
    built.rename(cache / "tiny_prompts" / "default")
    (cache / "tiny_prompts").rename(cache / "someone___tiny_prompts")
    source = open_input(InputSpec("someone/tiny_prompts"))
    assert source.format == "dataset" and source.total == 4
    assert [r.prompt for r in source.records][:2] == ["a", "b"]
    with pytest.raises(InputError, match="nor a dataset in the local Hugging Face cache"):
        open_input(InputSpec("someone/not_cached"))


def test_parse_native_units_name_rows():
    record = parse_native({"prompt": ""}, 5, unit="row")
    assert record.where == "row 5" and record.where_at(1) == "row 1"


def test_a_dataset_row_is_read_as_a_line(tmp_path):
    """An id column, sampling and chat fields in columns of their names, as a JSONL line's."""
    import datasets

    rows = {
        "id": ["a", "b", "c"],
        "prompt": ["one", None, "three"],
        "max_tokens": [3, 4, None],
        "temperature": [0.0, 0.5, 0.7],
        "notes": ["x", "y", "z"],  # a column of the row's own, ignored
    }
    datasets.Dataset.from_dict(rows).to_parquet(tmp_path / "rows.parquet")
    source = open_input(InputSpec(str(tmp_path / "rows.parquet")))
    records = list(source.records)
    assert source.note is None  # a "prompt" column needs no saying
    assert [r.id for r in records] == ["a", "b", "c"] and [r.line for r in records] == [1, 2, 3]
    assert records[0].sampling == {"max_tokens": 3, "temperature": 0.0}
    assert records[1].error == "column 'prompt' is null" and records[1].where == "row 2"
    assert records[2].sampling == {"temperature": 0.7}


def test_the_column_taken_as_the_prompt_is_named(dataset_files):
    source = open_input(InputSpec(str(dataset_files / "rows.parquet")))
    assert "column 'question' as the prompt" in source.note and "--prompt-column" in source.note
    assert (
        open_input(InputSpec(str(dataset_files / "rows.parquet"), prompt_column="question")).note
        is None
    )


def test_json_lines_named_json_are_jsonl(tmp_path):
    lines = tmp_path / "requests.json"
    lines.write_text(
        '{"id": "q1", "prompt": "hi", "max_tokens": 2}\n'
        '{"messages": [{"role": "user", "content": "x"}]}\n'
    )
    source = open_input(InputSpec(str(lines)))
    records = list(source.records)
    assert source.format == "jsonl" and records[0].id == "q1"
    assert records[0].sampling == {"max_tokens": 2} and records[1].messages is not None
    array = tmp_path / "rows.json"
    array.write_text('[\n  {"prompt": "hi"}\n]\n')
    assert detect_format(str(array)) == "dataset"


def test_text_where_json_lines_are_expected_is_refused_with_the_hint(tmp_path, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello there\n{}\n")))
    with pytest.raises(InputError, match="stdin's first line is not JSON.*--input-format text"):
        open_input(InputSpec("-"))
    text = tmp_path / "prompts.jsonl"
    text.write_text("\nfirst prompt\nsecond prompt\n")
    with pytest.raises(InputError, match="is not JSON.*--input-format text"):
        open_input(InputSpec(str(text)))
    text.write_text('not json\n{"prompt": "a bad first line, then good ones"}\n')
    records = list(open_input(InputSpec(str(text))).records)  # one bad line among good ones
    assert records[0].error.startswith("invalid JSON") and records[1].prompt
    assert [r.prompt for r in open_input(InputSpec(str(text), input_format="text")).records]
