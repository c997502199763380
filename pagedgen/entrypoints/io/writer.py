import contextlib
import json
from typing import Any, BinaryIO

MAX_FAILED_LINES = 20


class OutputWriteError(Exception):
    """The output refused a record: a full disk, an I/O error, a network filesystem gone.

    Every record written before it is whole: the torn one was cut off where the output is a file.
    """

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.strerror or str(cause))
        self.cause = cause


class RecordWriter:
    """Writes each record as one JSON line with a single write and a flush, so a reader (or a
    crash) never sees half a record, except possibly a torn last line; a write that fails is cut
    back to the last whole line.

    Records are put with consecutive indices; ordered=True writes them in index order as soon as
    every earlier one is in, ordered=False as they come.
    """

    def __init__(self, stream: BinaryIO, ordered: bool = True) -> None:
        self.stream = stream
        self.ordered = ordered
        self.pending: dict[int, tuple[bytes, int, bool]] = {}
        self.next_index = 0
        self.num_written = 0
        self.num_bytes = 0  # of the whole records written
        self.num_failed = 0
        self.failed_lines: list[int] = []  # the first MAX_FAILED_LINES input lines that failed
        self.start = stream.tell() if stream.seekable() else None

    def put(self, index: int, record: dict[str, Any], line: int, failed: bool) -> None:
        self.pending[index] = (encode(record), line, failed)
        if not self.ordered:
            self._write(*self.pending.pop(index))
            return
        while self.next_index in self.pending:
            self._write(*self.pending.pop(self.next_index))
            self.next_index += 1

    @property
    def num_buffered(self) -> int:
        return len(self.pending)

    def cut_torn_record(self) -> None:
        """Cuts the output back to its last whole record, where it is a file (best effort)."""
        if self.start is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.truncate(self.start + self.num_bytes)

    def _write(self, data: bytes, line: int, failed: bool) -> None:
        try:
            view = memoryview(data)
            while view:
                written = self.stream.write(view)
                view = view[written if written is not None else len(view) :]
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            self.cut_torn_record()
            raise OutputWriteError(e) from e
        self.num_written += 1
        self.num_bytes += len(data)
        if failed:
            self.num_failed += 1
            if len(self.failed_lines) < MAX_FAILED_LINES:
                self.failed_lines.append(line)


def encode(record: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape in the input
        return (json.dumps(record) + "\n").encode("ascii")
