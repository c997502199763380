"""End-to-end input and output formats: a shell pipeline, OpenAI batch, datasets, text."""

import json
import subprocess

import pytest

from tests.cli_util import COMMAND, ENV, read_records, run_in_process, tiny, write_jsonl


@pytest.mark.slow
def test_stdin_to_stdout_pipeline(tiny_llama_path, tmp_path):
    src = write_jsonl(
        tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"say {i}"} for i in range(6)]
    )
    run = " ".join([*COMMAND, "run", "-", "-o", "-", *tiny(tiny_llama_path)[:-1]])  # progress on
    count = "python -c 'import json, sys; print(sum(1 for l in sys.stdin if json.loads(l)[\"text\"] is not None))'"  # noqa: E501
    result = subprocess.run(
        f"cat {src} | {run} 2>{tmp_path / 'err.txt'} | {count}",
        shell=True,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert result.returncode == 0, (tmp_path / "err.txt").read_text()
    assert result.stdout.strip() == "6"  # only JSON records reached stdout
    assert "pagedgen run" in (tmp_path / "err.txt").read_text()  # the summary went to stderr


def test_openai_batch_round_trip_and_resume(tiny_llama_path, tmp_path, capsys):
    def request(custom_id: str, url: str, body: dict) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}

    chat, completions = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "hello"}]
    requests = [
        request("chat-1", chat, {"model": "m", "messages": user, "max_tokens": 4}),
        request(
            "chat-2",
            chat,
            {
                "messages": user,
                "n": 2,
                "seed": 1,
                "temperature": 0.8,
                "logprobs": True,
                "top_logprobs": 3,
            },
        ),  # fmt: skip
        request(
            "cmpl-1",
            completions,
            {"prompt": "once upon", "max_completion_tokens": 3, "logprobs": 2, "stop": ["zz"]},
        ),  # fmt: skip
        request("bad-url", "/v1/embeddings", {"input": "x"}),
        request("cmpl-2", completions, {"prompt": [5, 6, 7], "max_tokens": 2}),
    ]
    src = write_jsonl(tmp_path / "batch.jsonl", requests)
    out = tmp_path / "out.jsonl"
    args = ["run", str(src), "-o", str(out), *tiny(tiny_llama_path, max_tokens=5)]
    code, _, stderr = run_in_process(capsys, *args)
    assert code == 1, stderr
    records = read_records(out)
    assert [r["custom_id"] for r in records] == [r["custom_id"] for r in requests]
    assert [r["id"] for r in records] == [f"batch_req_{i}" for i in range(1, 6)]
    by_id = {r["custom_id"]: r for r in records}
    assert by_id["bad-url"]["response"] is None and "line 4" in by_id["bad-url"]["error"]["message"]
    for custom_id in ("chat-1", "chat-2", "cmpl-1", "cmpl-2"):
        response = by_id[custom_id]["response"]
        assert by_id[custom_id]["error"] is None and response["status_code"] == 200
        body = response["body"]
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
        assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    chat_1 = by_id["chat-1"]["response"]["body"]
    assert chat_1["object"] == "chat.completion" and len(chat_1["choices"]) == 1
    assert chat_1["usage"]["completion_tokens"] == 4
    assert chat_1["choices"][0]["message"]["role"] == "assistant"
    chat_2 = by_id["chat-2"]["response"]["body"]["choices"]
    assert [c["index"] for c in chat_2] == [0, 1]
    steps = chat_2[0]["logprobs"]["content"]
    assert len(steps) == 5 and all(len(step["top_logprobs"]) == 3 for step in steps)
    assert all(step["logprob"] <= 0 and isinstance(step["bytes"], list) for step in steps)
    cmpl_1 = by_id["cmpl-1"]["response"]["body"]
    assert cmpl_1["object"] == "text_completion" and isinstance(cmpl_1["choices"][0]["text"], str)
    logprobs = cmpl_1["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 3
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])

    full = out.read_text().splitlines(keepends=True)
    out.write_text(full[0] + full[3] + full[2][:20])  # records 1 and 4 kept, 3 torn
    code, _, stderr = run_in_process(capsys, *args, "--resume")
    assert code == 1, stderr
    resumed = {r["custom_id"]: r for r in read_records(out)}
    assert len(read_records(out)) == 5 and set(resumed) == set(by_id)
    assert (
        resumed["cmpl-2"]["response"]["body"]["choices"]
        == (by_id["cmpl-2"]["response"]["body"]["choices"])
    )


def test_datasets_save_to_disk_and_parquet(tiny_llama_path, tmp_path, capsys):
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict(
        {
            "question": ["what is one", "what is two", None, "what is four"],
            "chat": [[{"role": "user", "content": f"hi {i}"}] for i in range(4)],
            "qid": ["q1", "q2", "q3", "q4"],
        }
    )
    ds.save_to_disk(tmp_path / "saved")
    ds.to_parquet(tmp_path / "rows.parquet")

    saved_out, parquet_out = tmp_path / "saved.jsonl", tmp_path / "parquet.jsonl"
    options = tiny(tiny_llama_path, max_tokens=3)
    code, _, stderr = run_in_process(
        capsys, "run", str(tmp_path / "saved"), "-o", str(saved_out), "--messages-column",
        "chat", "--id-column", "qid", *options,
    )  # fmt: skip
    assert code == 0, stderr
    records = read_records(saved_out)
    assert [r["id"] for r in records] == ["q1", "q2", "q3", "q4"]
    assert all(r["completion_tokens"] == 3 for r in records)

    stats = tmp_path / "stats.json"
    code, _, stderr = run_in_process(
        capsys, "run", str(tmp_path / "rows.parquet"), "-o", str(parquet_out), "--limit", "3",
        "--order", "completion", "--stats-json", str(stats), *options,
    )  # fmt: skip
    assert code == 1, stderr
    records = sorted(read_records(parquet_out), key=lambda r: r["line"])
    assert [r["id"] for r in records] == ["row-1", "row-2", "row-3"]
    assert records[2]["error"] == "row 3: column 'question' is null"
    summary = json.loads(stats.read_text())
    assert summary["num_requests"] == 3 and summary["num_failed"] == 1
    assert summary["failed_lines"] == [3] and summary["interrupted"] is False
    for key in ("requests_per_s", "output_tokens_per_s", "mean_latency_s", "p90_latency_s",
                "peak_kv_cache_usage_perc", "mean_kv_cache_usage_perc", "num_preemptions",
                "prefix_cache_hit_rate"):  # fmt: skip
        assert key in summary


def test_text_input_with_per_line_defaults(tiny_llama_path, tmp_path, capsys):
    src = tmp_path / "prompts.txt"
    src.write_bytes(b"first prompt\n\nsecond prompt\n")
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(src), "-o", str(out), *tiny(tiny_llama_path, 2), "-n", "2"
    )
    assert code == 0, stderr
    records = read_records(out)
    assert [(r["id"], r["line"]) for r in records] == [("line-1", 1), ("line-3", 3)]
    assert all(len(r["text"]) == 2 and r["completion_tokens"] == 4 for r in records)


def test_progress_off_a_terminal_logs_a_plain_line_every_few_seconds():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from pagedgen.core.stats import EngineStats
    from pagedgen.entrypoints.batch.job import JobProgress
    from pagedgen.entrypoints.batch.metrics import RunMetrics
    from pagedgen.entrypoints.cli.progress import LOG_EVERY_S, RunProgress

    stream = io.StringIO()
    stats = EngineStats(num_prompt_tokens=1000, num_generation_tokens=300, num_running=3,
                        num_waiting=5, kv_cache_usage_perc=0.42, num_preemptions=2)  # fmt: skip
    engine = SimpleNamespace(stats=stats, num_unfinished_requests=8)
    with RunProgress(Console(file=stream, width=200), enabled=True) as progress:
        progress.last_log -= LOG_EVERY_S
        progress.update(JobProgress(40, 100, RunMetrics(), engine, 0))
        progress.update(JobProgress(41, 100, RunMetrics(), engine, 0))  # too soon for a line
        progress.update(JobProgress(41, 100, RunMetrics(), engine, 1))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("40/100 requests · prompt ") and "running 3 · waiting 5" in lines[0]
    assert "KV cache" in lines[0] and "42%" in lines[0] and "preemptions 2" in lines[0]
    assert "prefix cache hit rate 0%" in lines[0] and "swapped 0" in lines[0]
    assert lines[1].startswith("stopping: no new requests; finishing the 8 started")


def test_dataset_options_are_refused_for_other_inputs(tiny_llama_path, tmp_path, capsys):
    rows = [{"qid": f"q{i}", "q": f"what is {i}"} for i in range(2)]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    (tmp_path / "prompts.txt").write_text("first prompt\n")
    out = tmp_path / "out.jsonl"
    options = ["-o", str(out), *tiny(tiny_llama_path, 2)]
    for path, args, message in (
        (src, ["--prompt-column", "q"], "--prompt-column applies to dataset inputs"),
        (src, ["--messages-column", "q"], "--messages-column applies to dataset inputs"),
        (src, ["--id-column", "qid"], "--id-column applies to dataset inputs"),
        (src, ["--split", "test"], "--split applies to dataset inputs"),
        (tmp_path / "prompts.txt", ["--input-format", "text", "--id-column", "qid"], "as text"),
    ):
        code, _, stderr = run_in_process(capsys, "run", str(path), *options, *args)
        assert code == 2, stderr
        assert message in stderr and "use --input-format dataset" in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1 and not out.exists()
    dataset = ["--input-format", "dataset", "--prompt-column", "q", "--id-column", "qid"]
    code, _, stderr = run_in_process(capsys, "run", str(src), *options, *dataset)
    assert code == 0, stderr
    assert [r["id"] for r in read_records(out)] == ["q0", "q1"]


def test_inputs_are_read_as_they_are(tiny_llama_path, tmp_path, capsys):
    """JSON lines named .json, and a parquet file with id and max_tokens columns, keep their ids
    and fields; --apply-chat-template gives plain prompts the chat template."""
    import datasets

    named_json = write_jsonl(
        tmp_path / "requests.json",
        [{"id": "q1", "prompt": "hello", "max_tokens": 2}, {"id": "q2", "prompt": "hi there"}],
    )
    out = tmp_path / "json.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(named_json), "-o", str(out), *tiny(tiny_llama_path)
    )
    assert code == 0, stderr
    records = sorted(read_records(out), key=lambda r: r["line"])
    assert [r["id"] for r in records] == ["q1", "q2"]
    assert [r["completion_tokens"] for r in records] == [2, 5]

    rows = {"id": ["p1", "p2"], "prompt": ["hello", "hi"], "max_tokens": [1, 3]}
    datasets.Dataset.from_dict(rows).to_parquet(tmp_path / "rows.parquet")
    out = tmp_path / "parquet.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(tmp_path / "rows.parquet"), "-o", str(out), *tiny(tiny_llama_path)
    )
    assert code == 0, stderr
    records = sorted(read_records(out), key=lambda r: r["line"])
    assert [(r["id"], r["completion_tokens"]) for r in records] == [("p1", 1), ("p2", 3)]

    plain, chat = tmp_path / "plain.jsonl", tmp_path / "chat.jsonl"
    for output, extra in ((plain, []), (chat, ["--apply-chat-template"])):
        code, _, stderr = run_in_process(
            capsys, "run", str(named_json), "-o", str(output), *tiny(tiny_llama_path), *extra
        )
        assert code == 0, stderr
    by_id = {r["id"]: r for r in read_records(chat)}
    for record in read_records(plain):  # the template wraps each prompt in turn markers
        assert by_id[record["id"]]["prompt_tokens"] > record["prompt_tokens"]
    code, _, stderr = run_in_process(
        capsys, "run", str(named_json), "-o", str(chat), "--resume", *tiny(tiny_llama_path)
    )
    assert code == 2 and "--apply-chat-template" in stderr


def test_text_on_stdin_is_refused_before_the_model_loads(tiny_llama_path, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", "-", "-o", str(out), *tiny(tiny_llama_path), stdin=b"tell me a story\n"
    )
    assert code == 2 and "--input-format text" in stderr and len(stderr.splitlines()) == 1
    assert not out.exists()
