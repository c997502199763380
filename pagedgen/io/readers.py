import json
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

from pagedgen.io.openai_batch import is_openai_request, parse_openai
from pagedgen.io.records import InputRecord, parse_native
from pagedgen.io.spec import InputError, InputSpec

DATASET_SUFFIXES = (".parquet", ".csv", ".arrow", ".json")


class InputSource(NamedTuple):
    """The records of an input, read lazily, and how many there are when that is cheap to know."""

    records: Iterator[InputRecord]
    total: int | None
    format: str  # jsonl, openai, text, dataset or sharegpt

    @property
    def is_openai(self) -> bool:
        return self.format == "openai"


def open_input(spec: InputSpec) -> InputSource:
    """Opens spec.path as the format it names (or looks like); raises InputError if unreadable."""
    input_format = spec.input_format
    if input_format == "auto":
        input_format = detect_format(spec.path)
    if input_format == "dataset":
        from pagedgen.io.hf_dataset import read_dataset

        records, total = read_dataset(spec)
    elif input_format == "sharegpt":
        from pagedgen.io.sharegpt import read_sharegpt

        records, total = read_sharegpt(spec.path), None
    else:
        lines = _binary_lines(spec.path)
        total = None if spec.path == "-" else _count_lines(spec.path)
        if input_format == "text":
            records = read_text(lines)
        else:
            peeked, lines = _peek_object(lines)
            if input_format == "jsonl" and is_openai_request(peeked):
                input_format = "openai"
            parse = parse_openai if input_format == "openai" else parse_native
            records = read_jsonl(lines, parse, spec.reference_column)
    if spec.limit is not None:
        records = islice(records, spec.limit)
        total = spec.limit if total is None else min(total, spec.limit)
    return InputSource(records, total, input_format)


def detect_format(path: str) -> str:
    if path == "-":
        return "jsonl"
    if path == "sharegpt":
        return "sharegpt"
    p = Path(path)
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


def read_jsonl(
    lines: Iterable[bytes | str],
    parse: Callable[[object, int], InputRecord] = parse_native,
    reference_column: str | None = None,
) -> Iterator[InputRecord]:
    """Parses JSON lines lazily; a bad line becomes a record with an error instead of stopping."""
    for line, text in _decoded(lines):
        if isinstance(text, InputRecord):
            yield text
            continue
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            error = f"invalid JSON: {e.msg} (column {e.colno})"
            yield InputRecord(line, f"line-{line}", error=error)
            continue
        record = parse(obj, line)
        if reference_column is not None and isinstance(obj, dict):
            record = record._replace(reference=obj.get(reference_column))
        yield record


def read_text(lines: Iterable[bytes | str]) -> Iterator[InputRecord]:
    """One prompt per line; blank lines are skipped."""
    for line, text in _decoded(lines):
        if isinstance(text, InputRecord):
            yield text
        elif text.strip():
            yield InputRecord(line, f"line-{line}", prompt=text.rstrip("\r\n"))


def _decoded(lines: Iterable[bytes | str]) -> Iterator[tuple[int, str | InputRecord]]:
    for line, raw in enumerate(lines, start=1):
        if isinstance(raw, str):
            yield line, raw
            continue
        if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield line, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            error = f"undecodable bytes: not UTF-8 ({e.reason} at byte {e.start})"
            yield line, InputRecord(line, f"line-{line}", error=error)


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
            return sum(1 for line in f if line.strip())
    except OSError as e:
        raise InputError(f"cannot read input {path!r}: {e.strerror}") from e


def _peek_object(lines: Iterator[bytes]) -> tuple[Any, Iterator[bytes]]:
    """The first line that parses as JSON, and the lines with the peeked ones put back."""
    seen: list[bytes] = []
    for raw in islice(lines, 100):
        seen.append(raw)
        try:
            return json.loads(raw), chain(seen, lines)
        except ValueError:
            continue
    return None, chain(seen, lines)
