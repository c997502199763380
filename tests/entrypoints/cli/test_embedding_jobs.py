"""`pagedgen run` as an embedding job: native and OpenAI /v1/embeddings lines in, embeddings out,
checked against LLM.embed; the options and lines that do not apply to embeddings are refused."""

import json

import pytest
import torch

from pagedgen import LLM, PoolingParams
from tests.cli_util import read_records, run_in_process, write_jsonl
from tests.worker.pooler.test_embed import save_base_model

QUIET = ["--kv-cache-memory", "0.01", "--no-progress"]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-base")
    save_base_model(folder, "llama")
    return folder


def embed(folder, prompts, params=None, **engine):
    llm = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None, **engine)
    return [out.outputs.embedding for out in llm.embed(prompts, params, use_tqdm=False)]


def assert_close(got, expected):
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-6, rtol=1e-5)


def test_a_run_writes_one_embedding_per_line(base_model, tmp_path, capsys):
    rows = [
        {"id": "a", "prompt": "hello world"},
        {"prompt": [5, 6, 7], "use_activation": False},
        {"prompt": "x" * 40, "truncate_prompt_tokens": 8},
        {"messages": [{"role": "user", "content": "hi"}]},  # no chat template: an error line
        {"prompt": "y", "temperature": 0.5},
        {"prompt": "z", "dimensions": 8},
    ]
    src, out, stats = (
        write_jsonl(tmp_path / "in.jsonl", rows),
        tmp_path / "out.jsonl",
        tmp_path / "s",
    )
    args = ["run", str(src), "-o", str(out), "-m", str(base_model), "--stats-json", str(stats)]
    code, _, err = run_in_process(capsys, *args, *QUIET)
    assert code == 1, err  # some lines failed
    assert "runner pooling, task embed: LAST pooling, use_activation=True" in err
    assert "output tokens/s" not in err
    records = read_records(out)
    assert [r["id"] for r in records] == ["a", "line-2", "line-3", "line-4", "line-5", "line-6"]
    expected = embed(
        base_model,
        ["hello world", [5, 6, 7]],
        [PoolingParams(), PoolingParams(use_activation=False)],
    )
    assert_close([records[0]["embedding"], records[1]["embedding"]], expected)
    (cut,) = embed(base_model, ["x" * 40], PoolingParams(truncate_prompt_tokens=8))
    assert_close(records[2]["embedding"], cut)
    assert records[2]["prompt_tokens"] == 8
    assert records[0]["error"] is None and len(records[0]["embedding"]) == 64
    assert "chat template" in records[3]["error"]
    assert (
        records[4]["error"] == "line 5: 'temperature' is a sampling field; this job pools (embed)"
    )
    assert records[4]["embedding"] is None and records[4]["latency"] is None
    # the same keys on every line, success or error
    keys = {"id", "line", "embedding", "prompt_tokens", "latency", "error", "request_hash"}
    assert all(set(r) == keys for r in records)
    assert "does not support Matryoshka" in records[5]["error"]
    summary = json.loads(stats.read_text())
    assert summary["runner"] == "pooling" and summary["num_failed"] == 3


def test_openai_embedding_requests(base_model, tmp_path, capsys):
    def request(custom_id, body, url="/v1/embeddings"):
        return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}

    rows = [
        request("one", {"model": "m", "input": "hello world", "encoding_format": "float"}),
        request("ids", {"input": [[5, 6, 7]], "use_activation": False}),
        request("two", {"input": ["a", "b"]}),
        request("b64", {"input": "a", "encoding_format": "base64"}),
        request("chat", {"messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions"),
    ]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, _, err = run_in_process(
        capsys, "run", str(src), "-o", str(out), "-m", str(base_model), *QUIET
    )
    assert code == 1, err
    one, ids, two, b64, chat = read_records(out)
    expected = embed(
        base_model,
        ["hello world", [5, 6, 7]],
        [PoolingParams(), PoolingParams(use_activation=False)],
    )
    body = one["response"]["body"]
    assert body["object"] == "list" and body["model"] == str(base_model)
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    assert_close(body["data"][0]["embedding"], expected[0])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 11
    assert_close(ids["response"]["body"]["data"][0]["embedding"], expected[1])
    assert "one request per input" in two["error"]["message"]
    assert "'encoding_format' must be \"float\"" in b64["error"]["message"]
    assert "takes /v1/embeddings requests" in chat["error"]["message"]


def test_embedding_lines_need_a_pooling_runner(tiny_llama_path, tmp_path, capsys):
    rows = [
        {"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "hi"}},
        {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}},
    ]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    args = ["run", str(src), "-o", str(out), "-m", str(tiny_llama_path), *QUIET]
    code, _, err = run_in_process(capsys, *args)
    assert code == 1, err
    embedding, completion = read_records(out)
    assert "needs an embedding job: --runner pooling" in embedding["error"]["message"]
    assert completion["error"] is None
    src = write_jsonl(tmp_path / "native.jsonl", [{"prompt": "hi", "dimensions": 4}])
    code, stdout, err = run_in_process(
        capsys, "run", str(src), "-o", "-", "-m", str(tiny_llama_path), *QUIET
    )
    assert code == 1, err
    assert "'dimensions' is for embeddings (--runner pooling)" in json.loads(stdout)["error"]
    # With --runner pooling, the same causal checkpoint embeds
    src = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "hi"}])
    args = ["run", str(src), "-o", "-", "-m", str(tiny_llama_path), "--runner", "pooling", *QUIET]
    code, stdout, err = run_in_process(capsys, *args)
    assert code == 0, err
    (record,) = [json.loads(line) for line in stdout.splitlines()]
    assert record["embedding"] == pytest.approx(
        embed(tiny_llama_path, ["hi"], runner="pooling")[0], abs=1e-6
    )


@pytest.mark.parametrize(
    "option, message",
    [
        (["--temperature", "0"], "--temperature is a sampling option; this job pools"),
        (["--max-tokens", "3"], "--max-tokens is a sampling option"),
        (["--regex", "a+"], "--json-schema is a sampling option"),
        (["--tool-call-parser", "hermes"], "--tool-call-parser reads generated answers"),
        (["--pooler-config", '{"pooling_type": "MAX"}'], "pooling_type must be one of"),
        (["--async-scheduling"], "does not run async_scheduling"),
    ],
)
def test_options_that_do_not_apply_to_embeddings_are_usage_errors(
    base_model, tmp_path, capsys, option, message
):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    out = tmp_path / "out.jsonl"
    code, _, err = run_in_process(
        capsys, "run", str(src), "-o", str(out), "-m", str(base_model), *option, *QUIET
    )
    assert code == 2, err
    assert message in err
    assert not out.exists()


def test_profile_refuses_a_pooling_model(base_model, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    for simulate in ([], ["--simulate"]):
        code, _, err = run_in_process(capsys, "profile", str(src), "-m", str(base_model), *simulate)
        assert code == 2, err
        assert "profile measures generation; this model pools" in err


def test_an_embedding_job_resumes(base_model, tmp_path, capsys):
    rows = [{"id": f"r{i}", "prompt": f"text {i}"} for i in range(5)]
    out = tmp_path / "out.jsonl"
    first = write_jsonl(tmp_path / "first.jsonl", rows[:3])
    args = ["-o", str(out), "-m", str(base_model), *QUIET]
    code, _, err = run_in_process(capsys, "run", str(first), *args)
    assert code == 0, err
    kept = read_records(out)
    src = write_jsonl(tmp_path / "all.jsonl", rows)
    code, _, err = run_in_process(capsys, "run", str(src), *args, "--resume")
    assert code == 0, err
    assert "3 records kept" in err
    records = read_records(out)
    assert records[:3] == kept and [r["id"] for r in records] == [f"r{i}" for i in range(5)]
    (expected,) = embed(base_model, ["text 4"])
    assert_close(records[4]["embedding"], expected)
