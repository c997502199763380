import json
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

from pagedgen.entrypoints.io.openai_batch import is_openai_request, parse_openai
from pagedgen.entrypoints.io.records import InputRecord, parse_native
from pagedgen.entrypoints.io.shard import parse_shard
from pagedgen.entrypoints.io.spec import InputError, InputSpec

DATASET_SUFFIXES = (".parquet", ".csv", ".arrow", ".json")
NOT_JSON = object()  # what _peek_object finds in lines none of which is JSON


class InputSource(NamedTuple):
    """The records of an input, read lazily, and how many there are when that is cheap to know."""

    records: Iterator[InputRecord]
    total: int | None
    format: str  # jsonl, openai, text, dataset or sharegpt
    note: str | None = None  # how the input was read, where the user did not say (stderr)

    @property
    def is_openai(self) -> bool:
        return self.format == "openai"


def open_input(spec: InputSpec) -> InputSource:
    """Opens spec.path as the format it names (or looks like); raises InputError if unreadable."""
    if spec.path == "-" and sys.stdin is None:
        raise InputError("stdin is closed; give the input as a file")
    input_format, note = spec.input_format, None
    if input_format == "auto":
        input_format = detect_format(spec.path)
    spec.check_format(input_format)
    if input_format == "dataset":
        from pagedgen.entrypoints.io.hf_dataset import read_dataset

        records, total, note = read_dataset(spec)
    elif input_format == "sharegpt":
        from pagedgen.entrypoints.io.sharegpt import read_sharegpt

        records, total = read_sharegpt(spec.path), None
    else:
        lines = _binary_lines(spec.path)
        total = None if spec.path == "-" else _count_lines(spec.path)
        if input_format == "text":
            records = read_text(lines)
        else:
            peeked, lines = _peek_object(lines, 1 if spec.path == "-" else 100)
            if peeked is NOT_JSON and spec.input_format == "auto":
                where = "stdin's first line" if spec.path == "-" else f"{spec.path!r}"
                raise InputError(
                    f"{where} is not JSON; for plain prompts, one a line, use --input-format text"
                )
            if input_format == "jsonl" and is_openai_request(peeked):
                input_format = "openai"
            parse = parse_openai if input_format == "openai" else parse_native
            records = read_jsonl(lines, parse, spec.reference_column)
    if spec.limit is not None:
        records = islice(records, spec.limit)
        total = spec.limit if total is None else min(total, spec.limit)
    if spec.shard is not None:
        shard = parse_shard(spec.shard)
        records = shard.filter(records)
        total = None if total is None else shard.size_of(total)
    return InputSource(records, total, input_format, note)


def detect_format(path: str) -> str:
    if path == "-":
        return "jsonl"
    if path == "sharegpt":
        return "sharegpt"
    p = Path(path)
    if p.suffix == ".json" and p.is_file() and _first_line_is_an_object(p):
        return "jsonl"  # JSON lines named .json
    if p.is_dir() or p.suffix in DATASET_SUFFIXES:
        if not p.exists():
            raise InputError(f"input {path!r} not found")
        return "dataset"
    if p.suffix == ".txt":
        return "text"
    if p.is_file():
        return "jsonl"
    if path.count("/") == 1 and not path.startswith((".", "/", "~")):
        return "dataset"  # a Hugging Face hub id, read from the local cache
    raise InputError(f"input file {path!r} not found")


def _first_line_is_an_object(path: Path) -> bool:
    """Whether the file's first line that is not blank is a whole JSON object by itself."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.strip():
                    try:
                        return isinstance(json.loads(raw), dict)
                    except ValueError:
                        return False
    except OSError:
        return False
    return False


def read_jsonl(
    lines: Iterable[bytes | str],
    parse: Callable[[object, int], InputRecord] = parse_native,
    reference_column: str | None = None,
) -> Iterator[InputRecord]:
    """Parses JSON lines lazily; a bad line becomes a record with an error instead of stopping.

    Only the record outlives its line: a long line is never held as bytes, text and objects at
    once while the record is used.
    """
    line = 0
    for raw in lines:  # not enumerate: it keeps its last (line, raw) tuple, a long line, alive
        line += 1  # noqa: SIM113
        record = _jsonl_record(line, raw, parse, reference_column)
        del raw
        if record is not None:
            yield record


def read_text(lines: Iterable[bytes | str]) -> Iterator[InputRecord]:
    """One prompt per line; blank lines are skipped."""
    line = 0
    for raw in lines:  # not enumerate, as above
        line += 1  # noqa: SIM113
        text = _decode(line, raw)
        del raw
        if isinstance(text, InputRecord):
            yield text
        elif text and not text.isspace():
            yield InputRecord(line, f"line-{line}", prompt=text.rstrip("\r\n"))


def _jsonl_record(
    line: int,
    raw: bytes | str,
    parse: Callable[[object, int], InputRecord],
    reference_column: str | None,
) -> InputRecord | None:
    text = _decode(line, raw)
    if isinstance(text, InputRecord):
        return text
    if not text or text.isspace():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return InputRecord(line, f"line-{line}", error=f"invalid JSON: {e.msg} (column {e.colno})")
    record = parse(obj, line)
    if reference_column is not None and isinstance(obj, dict):
        record = record._replace(reference=obj.get(reference_column))
    return record


def _decode(line: int, raw: bytes | str) -> str | InputRecord:
    """The line as text, or an error record if it is not UTF-8."""
    if isinstance(raw, str):
        return raw
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        error = f"undecodable bytes: not UTF-8 ({e.reason} at byte {e.start})"
        return InputRecord(line, f"line-{line}", error=error)


def _binary_lines(path: str) -> Iterator[bytes]:
    if path == "-":
        yield from sys.stdin.buffer
        return
    try:
        f = open(path, "rb")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"cannot read input {path!r}: {e.strerror}") from e
    with f:
        yield from f


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line and not line.isspace())
    except OSError as e:
        raise InputError(f"cannot read input {path!r}: {e.strerror}") from e


def _peek_object(lines: Iterator[bytes], limit: int) -> tuple[Any, Iterator[bytes]]:
    """The first line that parses as JSON among the first `limit` that are not blank (NOT_JSON
    if none does, None if there are none), and the lines with the peeked ones put back."""
    seen: list[bytes] = []
    found = None
    for raw in lines:
        seen.append(raw)
        if raw.isspace() or not raw:
            continue
        try:
            return json.loads(raw), _put_back(seen, lines)
        except ValueError:
            found = NOT_JSON
            limit -= 1
            if limit == 0:
                break
    return found, _put_back(seen, lines)


def _put_back(seen: list[bytes], lines: Iterator[bytes]) -> Iterator[bytes]:
    """seen, then lines; a line given out is no longer held here."""
    seen.reverse()
    while seen:
        yield seen.pop()
    yield from lines
