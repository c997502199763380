import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from pagedgen.entrypoints.io.generation_options import (
    PARTS_OPTIONS_NAME,
    GenerationOptions,
    check_options_writable,
    check_resumed_options,
    write_options,
)
from pagedgen.entrypoints.io.output_file import OutputFile
from pagedgen.entrypoints.io.output_lock import lock_output
from pagedgen.entrypoints.io.resume import ResumeState, scan_output
from pagedgen.entrypoints.io.spec import InputError
from pagedgen.entrypoints.io.writer import MAX_FAILED_LINES, OutputWriteError

PART_GLOB = "part-*.jsonl"
LOCK_NAME = ".lock"


class PartsOutput:
    """An output folder of part files (`--output-format parts`): each run writes a new part,
    and with resume the records of every part are kept. The folder is locked for one run at a
    time; `pagedgen merge FOLDER -o OUT` makes one ordered output of it. With options, the
    folder's options.json keeps them, checked as OutputFile checks a file's."""

    def __init__(
        self,
        path: str,
        resume: bool = False,
        overwrite: bool = False,
        options: GenerationOptions | None = None,
    ) -> None:
        self.path = path
        self.options = options
        self.note: str | None = None
        self._options_file = str(Path(path) / PARTS_OPTIONS_NAME)
        folder = Path(path)
        if folder.exists() and not folder.is_dir():
            raise InputError(f"--output-format parts needs a folder; {path!r} is a file")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise InputError(f"cannot write output folder {path!r}: {e.strerror}") from e
        self.part: OutputFile | None = None
        try:
            lock_output(self._lock_fd, path)
            parts = sorted(folder.glob(PART_GLOB))
            if parts and not resume and not overwrite:
                raise InputError(
                    f"output {path!r} already holds parts; pass --resume to continue it or "
                    "--overwrite to replace it"
                )
            if overwrite:
                for part in parts:
                    part.unlink()
                parts = []
            self.state, self._torn = _scan_parts(parts)
            if options is not None:
                check_options_writable(self._options_file, path)
                if self.state.done:
                    self.note = check_resumed_options(self._options_file, path, options)
            number = 1 + max((int(p.stem.split("-")[1]) for p in parts), default=-1)
            self.part = OutputFile(str(folder / f"part-{number:05d}.jsonl"))
        except BaseException:
            self.close(keep=False)
            raise

    @property
    def stream(self) -> BinaryIO:
        assert self.part is not None
        if self.options is not None:  # before the first record
            try:
                write_options(self._options_file, self.options)
            except OSError as e:
                raise OutputWriteError(e) from e
            self.options = None
        for path, num_torn_bytes in self._torn:  # a killed run's last record, cut at the start
            with open(path, "rb+") as f:
                f.truncate(os.path.getsize(path) - num_torn_bytes)
        self._torn = []
        return self.part.stream

    def close(self, keep: bool = True) -> None:
        try:
            if self.part is not None:
                self.part.close(keep)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)


def _scan_parts(parts: list[Path]) -> tuple[ResumeState, list[tuple[Path, int]]]:
    state = ResumeState()
    torn = []
    for part in parts:
        part_state = scan_output(str(part))
        repeated = sorted(set(state.done) & set(part_state.done))
        if repeated:
            raise InputError(f"input line {repeated[0]} has records in two parts, one in {part}")
        state.done.update(part_state.done)
        state.num_failed += part_state.num_failed
        state.failed_lines = sorted(state.failed_lines + part_state.failed_lines)
        del state.failed_lines[MAX_FAILED_LINES:]
        if part_state.num_torn_bytes:
            torn.append((part, part_state.num_torn_bytes))
    return state, torn
