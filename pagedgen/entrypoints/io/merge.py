"""Part files (from `run --shard I/N`, or a `--ray --output-format parts` folder) merged into one
output in input order, refused unless every input record has exactly one output record."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pagedgen.entrypoints.io.output_file import OutputFile, refuse_input_as_output
from pagedgen.entrypoints.io.readers import open_input
from pagedgen.entrypoints.io.resume import record_line
from pagedgen.entrypoints.io.spec import InputError, InputSpec

MAX_LINES_SHOWN = 10


class MergeError(Exception):
    """The parts are not one whole output: a record missing, repeated, or torn."""


class Located(NamedTuple):
    part: int  # index into the part paths
    offset: int
    length: int


@dataclass(slots=True)
class MergeResult:
    num_records: int
    num_failed: int
    num_parts: int


def part_files(paths: list[str]) -> list[Path]:
    """The part files named: files as given, folders as the *.jsonl files they hold."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.glob("*.jsonl") if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"part {str(path)!r} not found")
    if not files:
        raise InputError("no part files to merge")
    return files


def index_parts(files: list[Path]) -> tuple[dict[int, Located], int]:
    """Where each input line's record is; raises MergeError on a repeated or torn record."""
    located: dict[int, Located] = {}
    num_failed = 0
    for part, path in enumerate(files):
        offset = 0
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.endswith(b"\n"):
                    raise MergeError(
                        f"{str(path)!r} ends with a torn record (its run was killed); "
                        "resume that run first"
                    )
                try:
                    obj = json.loads(raw)
                except ValueError:
                    obj = None
                line = record_line(obj)
                if line is None:
                    raise InputError(f"line {number} of {str(path)!r} is not an output record")
                if line in located:
                    first = files[located[line].part]
                    raise MergeError(
                        f"input line {line} has two records: in {str(first)!r} and "
                        f"{str(path)!r} (line {number})"
                    )
                located[line] = Located(part, offset, len(raw))
                num_failed += obj.get("error") is not None
                offset += len(raw)
    return located, num_failed


def check_complete(lines: set[int], input_spec: InputSpec | None) -> None:
    """Every input line has a record: those of the input when given, else lines 1..the last."""
    if input_spec is not None:
        expected = {record.line for record in open_input(input_spec).records}
    else:
        expected = set(range(1, max(lines, default=0) + 1))
    missing, extra = sorted(expected - lines), sorted(lines - expected)
    if missing:
        raise MergeError(f"{len(missing)} input lines have no record: {_shown(missing)}")
    if extra:
        raise MergeError(f"{len(extra)} records answer no input line: {_shown(extra)}")


def merge_parts(
    paths: list[str], output: str, input_spec: InputSpec | None = None, overwrite: bool = False
) -> MergeResult:
    """Writes the records of the parts to output in input order; raises MergeError (and writes
    nothing) unless they hold exactly one record per input line; raises InputError for an output
    that is a part or the input, whatever overwrite says."""
    files = part_files(paths)
    for path in files:
        refuse_input_as_output(str(path), output, "part")
    input_path = None if input_spec is None else input_spec.path
    located, num_failed = index_parts(files)
    check_complete(set(located), input_spec)
    out = OutputFile(output, overwrite=overwrite, input_path=input_path)
    handles = [open(path, "rb") for path in files]  # noqa: SIM115
    try:
        for line in sorted(located):
            part, offset, length = located[line]
            handles[part].seek(offset)
            out.stream.write(handles[part].read(length))
    except BaseException:
        out.close(keep=False)
        raise
    finally:
        for handle in handles:
            handle.close()
    out.close()
    return MergeResult(len(located), num_failed, len(files))


def _shown(lines: list[int]) -> str:
    more = ", ..." if len(lines) > MAX_LINES_SHOWN else ""
    return ", ".join(map(str, lines[:MAX_LINES_SHOWN])) + more
