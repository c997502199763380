import json
import os
import sys
from dataclasses import dataclass, field
from typing import BinaryIO

from pagedgen.io.openai_batch import line_of_batch_id
from pagedgen.io.spec import InputError
from pagedgen.io.writer import MAX_FAILED_LINES


@dataclass(slots=True)
class ResumeState:
    """What an existing output already holds: input line -> the id its record carries."""

    done: dict[int, str | None] = field(default_factory=dict)
    num_failed: int = 0
    failed_lines: list[int] = field(default_factory=list)
    num_torn_bytes: int = 0


class OutputFile:
    """The output stream, opened for a fresh run or for --resume.

    Resuming keeps every complete record, cuts off a torn last line (a write that a kill
    interrupted) and appends after them. A fresh run refuses to replace records it would lose
    unless overwrite is set.
    """

    def __init__(self, path: str, resume: bool = False, overwrite: bool = False) -> None:
        self.path = path
        self.state = ResumeState()
        if path == "-":
            if resume:
                raise InputError("--resume needs an output file, not stdout")
            self.stream: BinaryIO = sys.stdout.buffer
            return
        if resume and os.path.exists(path):
            self.state = scan_output(path)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - self.state.num_torn_bytes)
        elif not overwrite and os.path.isfile(path) and os.path.getsize(path) > 0:
            raise InputError(
                f"output {path!r} already holds records; pass --resume to continue it or "
                "--overwrite to replace it"
            )
        try:
            self.stream = open(path, "ab" if resume else "wb", buffering=0)  # noqa: SIM115
        except OSError as e:
            raise InputError(f"cannot write output {path!r}: {e.strerror}") from e

    def close(self) -> None:
        if self.stream is not sys.stdout.buffer:
            self.stream.close()


def scan_output(path: str) -> ResumeState:
    """Reads the records of an existing output; a last line without its newline is torn."""
    state = ResumeState()
    try:
        f = open(path, "rb")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"cannot read output {path!r} to resume it: {e.strerror}") from e
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                state.num_torn_bytes = len(raw)
                break
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            line = record_line(obj)
            if line is None:
                raise InputError(
                    f"line {number} of {path!r} is not a pagedgen output record; "
                    "cannot resume into it"
                )
            if line in state.done:
                continue
            state.done[line] = obj.get("custom_id", obj.get("id"))
            if obj.get("error") is not None:
                state.num_failed += 1
                if len(state.failed_lines) < MAX_FAILED_LINES:
                    state.failed_lines.append(line)
    return state


def record_line(obj: object) -> int | None:
    """The input line an output record answers: its 'line', or the number in an OpenAI id."""
    if not isinstance(obj, dict):
        return None
    line = obj.get("line")
    if isinstance(line, int) and not isinstance(line, bool):
        return line
    return line_of_batch_id(obj.get("id"))
