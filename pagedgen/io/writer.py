import json
from typing import Any, BinaryIO

MAX_FAILED_LINES = 20


class RecordWriter:
    """Writes each record as one JSON line with a single write and a flush, so a reader (or a
    crash) never sees half a record, except possibly a torn last line.

    Records are put with consecutive indices; ordered=True writes them in index order as soon as
    every earlier one is in, ordered=False as they come.
    """

    def __init__(self, stream: BinaryIO, ordered: bool = True) -> None:
        self.stream = stream
        self.ordered = ordered
        self.pending: dict[int, tuple[bytes, int, bool]] = {}
        self.next_index = 0
        self.num_written = 0
        self.num_failed = 0
        self.failed_lines: list[int] = []  # the first MAX_FAILED_LINES input lines that failed

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

    def _write(self, data: bytes, line: int, failed: bool) -> None:
        view = memoryview(data)
        while view:
            written = self.stream.write(view)
            view = view[written if written is not None else len(view) :]
        self.stream.flush()
        self.num_written += 1
        if failed:
            self.num_failed += 1
            if len(self.failed_lines) < MAX_FAILED_LINES:
                self.failed_lines.append(line)


def encode(record: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape in the input
        return (json.dumps(record) + "\n").encode("ascii")
