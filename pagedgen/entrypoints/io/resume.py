import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from pagedgen.entrypoints.io.openai_batch import line_of_batch_id
from pagedgen.entrypoints.io.readers import InputSource
from pagedgen.entrypoints.io.records import InputRecord, request_hash
from pagedgen.entrypoints.io.spec import InputError
from pagedgen.entrypoints.io.writer import MAX_FAILED_LINES


class DoneRecord(NamedTuple):
    """What an output record says of the request it answers."""

    id: str | None
    request_hash: str | None  # None in outputs of pagedgen before request hashes


@dataclass(slots=True)
class ResumeState:
    """What an existing output already holds, by the input line each record answers."""

    done: dict[int, DoneRecord] = field(default_factory=dict)
    num_failed: int = 0
    failed_lines: list[int] = field(default_factory=list)
    num_torn_bytes: int = 0
    checked: bool = False  # the input was proven to be the one these records answer


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
            state.done[line] = DoneRecord(
                obj.get("custom_id", obj.get("id")), obj.get("request_hash")
            )
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


def resume_source(
    source: InputSource,
    state: ResumeState,
    path: str,
    reopen: Callable[[], InputSource] | None = None,
) -> InputSource:
    """The input a resumed run reads, once proven to be the one the output's records answer.

    The proof reads the input up to the last line answered, before anything is written, and
    raises InputError at the first record made from another request. The unanswered records read
    on the way are kept for the run, unless reopen can read the input again from its start.
    """
    if state.checked or not state.done:
        return source
    skipped = _check_answers(source.records, state, path, keep=reopen is None)
    state.checked = True
    if reopen is not None:
        return reopen()
    return source._replace(records=chain(skipped, source.records))


def _check_answers(
    records: Iterator[InputRecord], state: ResumeState, path: str, keep: bool
) -> list[InputRecord]:
    last = max(state.done)
    skipped: list[InputRecord] = []
    for record in records:
        done = state.done.get(record.line)
        if done is None:
            if keep:
                skipped.append(record)
        elif done.id is not None and done.id != record.id:
            raise InputError(
                f"{path!r} does not answer this input: its record for {record.where} has id "
                f"{done.id!r}, the input has {record.id!r}"
            )
        elif done.request_hash is not None and done.request_hash != request_hash(record):
            raise InputError(
                f"{path!r} does not answer this input: its record for {record.where} was made "
                "from another request; resume with the input that made it, or --overwrite"
            )
        if record.line >= last:
            return skipped
    raise InputError(
        f"{path!r} does not answer this input: it holds a record for line {last}, past the end "
        "of the input"
    )
