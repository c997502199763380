"""The output of a run, without a model: one run per output (a lock the kernel drops with its
process), never the input, a resumed output proven to answer its input, whole records when a
write fails, and an input read in memory bounded by its longest line."""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import tracemalloc

import pytest

from pagedgen.entrypoints.io import InputError, InputSpec, OutputFile, OutputWriteError, open_input
from pagedgen.entrypoints.io.readers import InputSource, read_jsonl
from pagedgen.entrypoints.io.records import InputRecord, parse_native, request_hash
from pagedgen.entrypoints.io.resume import resume_source, scan_output
from pagedgen.entrypoints.io.writer import RecordWriter
from tests.cli_util import write_jsonl

HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_second_claim_names_the_run_holding_the_output(tmp_path):
    out = tmp_path / "out.jsonl"
    first = OutputFile(str(out))
    assert out.stat().st_mode & 0o111 == 0  # a data file, not an executable
    try:
        holder = subprocess.run(
            [
                sys.executable,
                "-c",
                "from pagedgen.entrypoints.io import OutputFile; OutputFile("
                + repr(str(out))
                + ")",
            ],
            capture_output=True,
            text=True,
        )
        assert holder.returncode != 0
        assert f"another pagedgen run (PID {os.getpid()}) is writing" in holder.stderr
    finally:
        first.close(keep=False)
    assert not out.exists()  # created by the claim, nothing written: removed


def test_a_killed_run_leaves_no_stale_lock(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(InputError, match=f"PID {holder.pid}"):
            OutputFile(str(out))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    OutputFile(str(out)).close()  # the kernel dropped the lock with the process


@pytest.mark.parametrize("flags", [{}, {"overwrite": True}, {"resume": True}])
def test_the_input_is_never_the_output(tmp_path, monkeypatch, flags):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a"}])
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    monkeypatch.chdir(tmp_path)
    for output in ("in.jsonl", "./link.jsonl", str(src)):
        with pytest.raises(InputError, match="is the input"):
            OutputFile(output, input_path=str(src), **flags)
    assert src.read_bytes() == before


def test_claiming_changes_no_byte_until_the_run_writes(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "line": 1, "error": null}\n')
    claimed = OutputFile(str(out), overwrite=True)
    claimed.close(keep=False)  # a run that failed before writing: the old output is intact
    assert out.read_text() == '{"id": "a", "line": 1, "error": null}\n'
    claimed = OutputFile(str(out), overwrite=True)
    claimed.stream.write(b'{"id": "b", "line": 1, "error": null}\n')
    claimed.close()
    assert out.read_text() == '{"id": "b", "line": 1, "error": null}\n'


def records_of(rows: list[dict]) -> list[InputRecord]:
    return [parse_native(row, line) for line, row in enumerate(rows, start=1)]


def answered(rows: list[dict], lines: list[int]) -> bytes:
    """An output holding records for these lines of rows, as a run writes them."""
    records = records_of(rows)
    return b"".join(
        json.dumps({"line": n, "id": records[n - 1].id, "error": None, "request_hash":
                    request_hash(records[n - 1])}).encode() + b"\n"
        for n in lines
    )  # fmt: skip


def test_resume_proves_the_output_answers_this_input_ids_or_not(tmp_path):
    made_from = [{"prompt": f"question {i}"} for i in range(6)]
    other = [{"prompt": f"another question {i}"} for i in range(6)]
    out = tmp_path / "out.jsonl"
    out.write_bytes(answered(made_from, [1, 2, 4]))
    for rows, ok in ((made_from, True), (other, False)):
        src = write_jsonl(tmp_path / "in.jsonl", rows)
        spec = InputSpec(str(src))
        output = OutputFile(str(out), resume=True)
        if ok:
            source = resume_source(open_input(spec), output.state, output.path)
            assert [r.line for r in source.records if r.line not in output.state.done] == [3, 5, 6]
        else:
            with pytest.raises(InputError, match="record for line 1 was made from another"):
                resume_source(open_input(spec), output.state, output.path)
        output.close()
    short = write_jsonl(tmp_path / "short.jsonl", made_from[:3])
    output = OutputFile(str(out), resume=True)
    with pytest.raises(InputError, match="line 4, past the end of the input"):
        resume_source(open_input(InputSpec(str(short))), output.state, output.path)
    output.close()
    assert out.read_bytes() == answered(made_from, [1, 2, 4])  # untouched


def test_resume_from_stdin_keeps_the_records_read_while_proving(tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(5)]
    out = tmp_path / "out.jsonl"
    out.write_bytes(answered(rows, [1, 3]))
    source = InputSource(iter(records_of(rows)), len(rows), "jsonl")  # read once, as stdin
    resumed = resume_source(source, scan_output(str(out)), str(out))
    assert [r.line for r in resumed.records] == [2, 4, 5]


class FullDisk(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does (the last write partial)."""

    def __init__(self, room: int) -> None:
        self.data = bytearray()
        self.room = room

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return len(self.data)

    def write(self, data) -> int:
        if len(self.data) >= self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = bytes(data[: self.room - len(self.data)])
        self.data += taken
        return len(taken)

    def truncate(self, size=None) -> int:
        del self.data[size:]
        return size


def test_a_write_that_fails_leaves_only_whole_records():
    disk = FullDisk(room=100)
    writer = RecordWriter(disk, ordered=True)
    with pytest.raises(OutputWriteError, match="No space left on device") as failure:
        for index in range(10):
            writer.put(index, {"line": index + 1, "text": "x" * 20}, index + 1, False)
    assert failure.value.cause.errno == errno.ENOSPC
    assert writer.num_written == 2 and disk.data.count(b"\n") == 2 and disk.data.endswith(b"\n")
    assert [json.loads(line)["line"] for line in disk.data.splitlines()] == [1, 2]


def test_a_long_line_is_held_once(tmp_path):
    size = 20_000_000
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "word " * (size // 5)}) + "\n" + '{"prompt": "x"}\n')
    tracemalloc.start()
    try:
        source = open_input(InputSpec(str(path)))
        first = next(source.records)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(first.prompt) == size
    # bytes, text and parsed prompt exist together only inside json.loads; then only the prompt
    assert peak < 3.5 * size and held < 1.5 * size, (peak / size, held / size)
    assert [r.prompt for r in read_jsonl(iter([b'{"prompt": "y"}\n']))] == ["y"]
