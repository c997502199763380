"""--resume after SIGKILL at random record counts, after Ctrl-C, and over out-of-order outputs."""

import json
import random
import signal
import time

import pytest

from pagedgen.entrypoints.io import OutputFile
from pagedgen.entrypoints.io.resume import scan_output
from pagedgen.entrypoints.io.spec import InputError
from tests.cli_util import count_lines, pagedgen, read_records, start, tiny, write_jsonl

NUM_PROMPTS = 300  # about 4 s of generation: long enough to kill in the middle


def run_args(model, src, out) -> list[str]:
    return ["run", str(src), "-o", str(out), *tiny(model, max_tokens=24), "--max-num-seqs", "2"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    rows = [
        {"id": f"p{i}", "prompt": f"prompt number {i} " * (1 + i % 5)} for i in range(NUM_PROMPTS)
    ]
    rows[7] = {"id": "p7", "prompt": ""}  # an error record among them
    return write_jsonl(tmp_path_factory.mktemp("resume") / "prompts.jsonl", rows)


@pytest.fixture(scope="module")
def reference(tiny_llama_path, prompts, tmp_path_factory):
    """An uninterrupted run's records, by line."""
    out = tmp_path_factory.mktemp("reference") / "out.jsonl"
    result = pagedgen(*run_args(tiny_llama_path, prompts, out))
    assert result.returncode == 1, result.stderr  # the one empty prompt
    return {r["line"]: r for r in read_records(out)}


def assert_complete(out, reference) -> None:
    records = read_records(out)
    lines = [r["line"] for r in records]
    assert sorted(lines) == list(range(1, NUM_PROMPTS + 1)), "a record lost or repeated"
    for r in records:
        assert (r["id"], r["text"], r["error"]) == (
            reference[r["line"]]["id"],
            reference[r["line"]]["text"],
            reference[r["line"]]["error"],
        )


def wait_for_lines(out, count: int, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while count_lines(out) < count and process.poll() is None:
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.02)


@pytest.mark.slow  # runs pagedgen in processes
def test_sigkill_at_random_record_counts_then_resume(tiny_llama_path, prompts, reference, tmp_path):
    rng = random.Random(4)
    out = tmp_path / "out.jsonl"
    args = run_args(tiny_llama_path, prompts, out)
    kills = 0
    for attempt in range(5):
        process = start(*args, *(["--resume"] if attempt else []))
        if attempt:  # mid-run, after a random number of new records
            wait_for_lines(out, count_lines(out) + rng.randint(1, 40), process)
        process.kill()  # the first attempt at once: during start-up, before any record
        kills += process.wait() == -signal.SIGKILL
        if attempt == 2:
            with out.open("ab") as f:
                f.write(b'{"id": "p99", "line": 100, "text": "torn wri')  # a write cut short
    assert kills >= 3
    assert count_lines(out) < NUM_PROMPTS
    result = pagedgen(*args, "--resume")
    assert result.returncode == 1, result.stderr  # the empty prompt's record is an error
    assert "resuming" in result.stderr and "1 failed" in result.stderr
    assert_complete(out, reference)


@pytest.mark.slow  # runs pagedgen in processes
def test_ctrl_c_finishes_started_requests_then_resume(
    tiny_llama_path, prompts, reference, tmp_path
):
    out = tmp_path / "out.jsonl"
    args = run_args(tiny_llama_path, prompts, out)
    process = start(*args)
    wait_for_lines(out, 10, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    stderr = stderr.decode()
    assert process.returncode == 130, stderr
    assert "finishing the" in stderr and "resume with: pagedgen" in stderr and "--resume" in stderr
    lines = [r["line"] for r in read_records(out)]
    assert lines == list(range(1, len(lines) + 1)) and len(lines) < NUM_PROMPTS
    result = pagedgen(*args, "--resume")
    assert result.returncode == 1, result.stderr
    assert_complete(out, reference)
    assert [r["line"] for r in read_records(out)] == list(range(1, NUM_PROMPTS + 1))


@pytest.mark.slow  # runs pagedgen in processes
def test_resume_fills_gaps_of_a_completion_order_output(
    tiny_llama_path, prompts, reference, tmp_path
):
    out = tmp_path / "out.jsonl"
    kept = [reference[line] for line in (5, 1, 90, 8, NUM_PROMPTS)]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"line": 3, "te')
    result = pagedgen(*run_args(tiny_llama_path, prompts, out), "--resume", "--order", "completion")
    assert result.returncode == 1, result.stderr
    records = read_records(out)
    assert records[:5] == kept  # kept as they were, the torn line dropped
    assert_complete(out, reference)


def test_scan_output_keeps_complete_records_and_drops_a_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(
        b'{"id": "a", "line": 1, "error": null}\n'
        b'{"id": "b", "line": 4, "error": "line 4: bad"}\n'
        b'{"id": "batch_req_9", "custom_id": "c", "response": null, "error": {"code": "x"}}\n'
        b'{"id": "d", "li'
    )
    state = scan_output(str(path))
    assert {line: done.id for line, done in state.done.items()} == {1: "a", 4: "b", 9: "c"}
    assert state.num_failed == 2 and state.failed_lines == [4, 9] and state.num_torn_bytes == 15
    output = OutputFile(str(path), resume=True)
    assert path.read_bytes().endswith(b'"li')  # claiming changes no byte
    output.stream.write(b"")
    output.close()
    assert path.read_bytes().endswith(b"}}\n")
    path.write_text('{"id": "a", "line": 1, "error": null}\nnot a record\n')
    with pytest.raises(InputError, match="line 2 of .* is not a pagedgen output record"):
        OutputFile(str(path), resume=True)


def test_resume_refuses_an_output_of_another_input(tiny_llama_path, prompts, tmp_path, capsys):
    from tests.cli_util import run_in_process

    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "someone-else", "line": 2, "error": null}\n')
    code, _, stderr = run_in_process(
        capsys, *run_args(tiny_llama_path, prompts, out), "--resume", "--limit", "3"
    )
    assert code == 2 and "does not answer this input" in stderr and "'someone-else'" in stderr


def test_writer_writes_whole_lines_in_index_order_or_as_they_come():
    import io

    from pagedgen.entrypoints.io.writer import RecordWriter

    class Recorder(io.RawIOBase):
        def __init__(self):
            self.writes: list[bytes] = []

        def writable(self):
            return True

        def write(self, data):
            self.writes.append(bytes(data))
            return len(data)

    ordered, unordered = Recorder(), Recorder()
    for stream, is_ordered in ((ordered, True), (unordered, False)):
        writer = RecordWriter(stream, ordered=is_ordered)
        for index in (2, 0, 3, 1):
            writer.put(index, {"line": index + 1, "text": "é\ud800"}, index + 1, index == 3)
        assert writer.num_written == 4 and writer.num_failed == 1 and writer.failed_lines == [4]
    assert [json.loads(w)["line"] for w in ordered.writes] == [1, 2, 3, 4]
    assert [json.loads(w)["line"] for w in unordered.writes] == [3, 1, 4, 2]
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in ordered.writes)
