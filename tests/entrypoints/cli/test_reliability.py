"""`pagedgen run` as a batch scheduler sees it: two runs on one output, SIGTERM and SIGHUP, a full
disk, start-up interrupted, closed standard streams. Signals are sent when the output reaches a
number of lines, never after a sleep."""

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_util import (
    COMMAND,
    ENV,
    count_lines,
    pagedgen,
    read_records,
    run_in_process,
    start,
    tiny,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # drills: pagedgen runs in processes that the tests signal

NUM_PROMPTS = 200


def run_args(model: Path, src: Path, out: Path | str) -> list[str]:
    return ["run", str(src), "-o", str(out), *tiny(model, max_tokens=24), "--max-num-seqs", "2"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    rows = [{"prompt": f"prompt number {i} " * (1 + i % 5)} for i in range(NUM_PROMPTS)]
    return write_jsonl(tmp_path_factory.mktemp("reliability") / "prompts.jsonl", rows)


def wait_until(condition, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def assert_whole_prefix(out: Path) -> list[dict]:
    assert out.read_bytes().endswith(b"\n")
    records = read_records(out)
    assert [r["line"] for r in records] == list(range(1, len(records) + 1))
    return records


def test_a_second_run_on_the_same_output_exits_2_at_once(tiny_llama_path, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    data = prompts.read_bytes()
    data = data[: data.index(b"\n", 2000) + 1]
    first = start(*run_args(tiny_llama_path, "-", out), stdin=subprocess.PIPE)
    first.stdin.write(data)  # and the input stays open: the run waits for more
    first.stdin.flush()
    wait_until(lambda: is_locked(out), first)
    second = pagedgen(*run_args(tiny_llama_path, prompts, out), "--overwrite")
    assert second.returncode == 2, second.stderr
    assert f"another pagedgen run (PID {first.pid}) is writing" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    first.stdin.close()
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()
    assert len(assert_whole_prefix(out)) == data.count(b"\n")


def test_two_runs_started_together_one_refused(tiny_llama_path, prompts, tmp_path):
    out = tmp_path / "c.jsonl"
    args = run_args(tiny_llama_path, prompts, out)[:-2] + ["--limit", "40"]
    runs = [start(*args), start(*args)]
    codes = sorted(run.wait(timeout=300) for run in runs)
    assert codes == [0, 2], [run.stderr.read().decode()[-500:] for run in runs]
    assert len(assert_whole_prefix(out)) == 40


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_like_ctrl_c(tiny_llama_path, prompts, tmp_path, sig, code):
    out = tmp_path / "out.jsonl"
    process = start(*run_args(tiny_llama_path, prompts, out))
    wait_until(lambda: count_lines(out) >= 10, process)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    stderr = stderr.decode()
    assert process.returncode == code, stderr
    assert "finishing the" in stderr and "pagedgen run" in stderr  # the summary table
    assert f"interrupted ({sig.name}):" in stderr and "resume with: pagedgen run" in stderr
    assert "--resume" in stderr.splitlines()[-1] and "Traceback" not in stderr
    assert 10 <= len(assert_whole_prefix(out)) < NUM_PROMPTS


def test_a_second_sigterm_stops_at_once_keeping_whole_records(tiny_llama_path, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    args = [*run_args(tiny_llama_path, prompts, out), "--max-num-seqs", "64"]
    process = start(*args)
    wait_until(lambda: count_lines(out) >= 1, process)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr.decode()
    assert "resume with:" in stderr.decode()
    assert len(assert_whole_prefix(out)) < NUM_PROMPTS
    result = pagedgen(*args, "--resume")
    assert result.returncode == 0, result.stderr
    assert len(assert_whole_prefix(out)) == NUM_PROMPTS


def test_ctrl_c_during_start_up_leaves_no_output(tiny_llama_path, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    args = [*run_args(tiny_llama_path, "-", out), "--input-format", "text"]  # reads no line yet
    process = start(*args, stdin=subprocess.PIPE)
    wait_until(out.exists, process)  # claimed: the model loads, or the run waits for input
    process.send_signal(signal.SIGINT)
    with contextlib.suppress(BrokenPipeError):  # a run already waiting for input sees a line
        process.stdin.write(b"one prompt\n")  # and stops before it
        process.stdin.close()
    stderr = process.stderr.read()
    process.wait(timeout=120)
    assert process.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode() and not out.exists()


def test_a_start_up_interrupt_is_not_swallowed_by_library_error_handling():
    """The handler raises wherever the main thread is; code that turns any Exception into an
    error (a tokenizer's loading, a prompt's per-line checks) must let it through, as it lets
    KeyboardInterrupt through."""
    from pagedgen.entrypoints.cli.signals import Interrupted, StopSignals

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even when run with `&`
    with contextlib.ExitStack() as stack:
        stack.callback(signal.signal, signal.SIGINT, previous)
        stack.enter_context(StopSignals())
        stack.enter_context(pytest.raises(Interrupted))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here, in the main thread
        except Exception:
            pass


@pytest.mark.parametrize("closed,args", [(0, ["-", "-o", "-"]), (1, ["{src}", "-o", "-"])])
def test_a_closed_standard_stream_is_a_usage_error(tiny_llama_path, prompts, closed, args):
    args = [a.replace("{src}", str(prompts)) for a in args]
    result = subprocess.run(
        [*COMMAND, "run", *args, *tiny(tiny_llama_path)],
        stderr=subprocess.PIPE,
        env=ENV,
        preexec_fn=lambda: os.close(closed),
        timeout=300,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert stderr.startswith("error: std") and "closed" in stderr
    assert len(stderr.strip().splitlines()) == 1


@pytest.fixture
def small_disk(tmp_path):
    """A 8 KiB tmpfs: a disk that fills up."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(folder)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root?); test_io_output covers the writer")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)


def test_a_full_disk_keeps_whole_records_and_says_how_to_resume(
    tiny_llama_path, prompts, small_disk, capsys
):
    out = small_disk / "out.jsonl"
    args = [*run_args(tiny_llama_path, prompts, out), "--limit", "60"]
    code, _, stderr = run_in_process(capsys, *args)
    assert code == 74, stderr[-2000:]
    error = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert error == [f"error: cannot write {out}: No space left on device; its "
                     f"{count_lines(out)} records are whole"]  # fmt: skip
    assert "Traceback" not in stderr and stderr.splitlines()[-1].startswith("resume with:")
    records = assert_whole_prefix(out)
    assert 0 < len(records) < 60
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    code, _, stderr = run_in_process(capsys, *args, "--resume")
    assert code == 0, stderr[-2000:]
    assert [r["line"] for r in assert_whole_prefix(out)] == list(range(1, 61))
    assert all(json.loads(line) for line in out.read_text().splitlines())


def test_a_start_up_signal_swallowed_by_library_code_still_stops_the_run(
    tiny_llama_path, prompts, tmp_path, monkeypatch
):
    """The Interrupted a signal raises lands wherever the main thread is; code there that catches
    everything (a library's import probe, say) must not make the run forget the signal."""
    from typer.testing import CliRunner

    import pagedgen
    from pagedgen.entrypoints.cli.main import app

    real_llm = pagedgen.LLM

    def llm_swallowing_a_signal(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here, raising Interrupted
        except BaseException:
            pass
        return real_llm(*args, **kwargs)

    monkeypatch.setattr(pagedgen, "LLM", llm_swallowing_a_signal)
    out = tmp_path / "out.jsonl"
    # A test run started in the background (`pytest &`) ignores SIGINT, and pagedgen keeps a
    # signal it was started ignoring ignored: give this in-process run Python's own handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = CliRunner().invoke(app, run_args(tiny_llama_path, prompts, out))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 130, result.output
    assert "interrupted (SIGINT) during start-up" in result.output and not out.exists()


def test_a_closed_output_pipe_exits_as_sigpipe_would(tiny_llama_path, prompts):
    """`pagedgen run ... -o - | head -1`: 141 (128 + SIGPIPE), as a C tool killed by it, not 1,
    which says that requests failed. Records with logprobs overflow the pipe's buffer, so the
    run cannot finish writing before the reader goes."""
    args = [*run_args(tiny_llama_path, prompts, "-"), "--logprobs", "5"]
    process = subprocess.Popen(
        [*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    first = json.loads(process.stdout.readline())
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert first["line"] == 1 and first["error"] is None
    assert stderr.splitlines()[-1] == "stopped: the reader of stdout closed it"
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
