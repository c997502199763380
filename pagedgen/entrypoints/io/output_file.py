import contextlib
import os
import stat
import sys
from typing import BinaryIO

from pagedgen.entrypoints.io.generation_options import (
    GenerationOptions,
    check_options_writable,
    check_resumed_options,
    options_path,
    write_options,
)
from pagedgen.entrypoints.io.output_lock import lock_output
from pagedgen.entrypoints.io.resume import ResumeState, scan_output
from pagedgen.entrypoints.io.spec import InputError
from pagedgen.entrypoints.io.writer import OutputWriteError


class OutputFile:
    """The output of one run: claimed before the model loads, written after.

    Claiming refuses an output that is the input (whatever the flags), one that another run is
    writing (see output_lock), and one holding records that a fresh run would lose unless
    overwrite is set; with resume it reads the records already there. Claiming changes no byte:
    the output is cut (to nothing, or with resume to its last whole record) when the run first
    takes `stream`, ready to write, and close(keep=False) removes an output this run created and
    left empty. '-' is stdout: never locked, never resumed.

    With options, a regular file's options are kept beside it (see generation_options), written
    with `stream`; resume refuses an output whose kept options differ, and notes (in `note`) one
    that has none.
    """

    def __init__(
        self,
        path: str,
        resume: bool = False,
        overwrite: bool = False,
        input_path: str | None = None,
        options: GenerationOptions | None = None,
    ) -> None:
        self.path = path
        self.resume = resume
        self.overwrite = overwrite
        self.state = ResumeState()
        self.created = False
        self.note: str | None = None
        self.options = options
        self.options_file: str | None = None
        self._wrote_options = False
        self._fd: int | None = None
        self._stream: BinaryIO | None = None
        if path == "-":
            if resume:
                raise InputError("--resume needs an output file, not stdout")
            if sys.stdout is None:
                raise InputError("stdout is closed; write the output to a file with -o FILE")
            refuse_input_as_output(input_path, "-")
            return
        refuse_input_as_output(input_path, path)
        self._fd, self.created = _claim(path)
        try:
            _check_writable(self._fd, path)
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):  # a pipe, a device: nothing kept
                self.options = None
            elif self.options is not None:
                self.options_file = options_path(path)
                check_options_writable(self.options_file, path)
            if resume:
                self.state = scan_output(path)
                if self.state.done and self.options is not None:
                    assert self.options_file is not None
                    self.note = check_resumed_options(self.options_file, path, self.options)
            elif not overwrite and os.fstat(self._fd).st_size > 0:
                raise InputError(
                    f"output {path!r} already holds records; pass --resume to continue it or "
                    "--overwrite to replace it"
                )
        except BaseException:
            self.close(keep=False)
            raise

    @property
    def stream(self) -> BinaryIO:
        """The output, ready for appending records (opened on first use)."""
        if self._stream is None:
            if self._fd is None:
                self._stream = sys.stdout.buffer
            else:
                if self.options is not None:  # before the first record
                    assert self.options_file is not None
                    try:
                        write_options(self.options_file, self.options)
                    except OSError as e:
                        raise OutputWriteError(e) from e
                    self._wrote_options = True
                st = os.fstat(self._fd)
                if stat.S_ISREG(st.st_mode):  # not a pipe or a device given as the output
                    os.ftruncate(
                        self._fd, st.st_size - self.state.num_torn_bytes if self.resume else 0
                    )
                self._stream = open(self._fd, "ab", buffering=0, closefd=False)  # noqa: SIM115
        return self._stream

    def close(self, keep: bool = True) -> None:
        """Releases the output, synced to disk first: raises OutputWriteError if that fails (a
        network filesystem may report lost writes only then). keep=False (the run failed)
        removes the output instead if this run created it and wrote no record to it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._stream is not None:
                self._stream.close()
            st = os.fstat(fd)
            if not keep and self.created and st.st_size == 0:
                if self._wrote_options and self.options_file is not None:
                    os.unlink(self.options_file)
                os.unlink(self.path)  # under the lock: see _claim
            elif stat.S_ISREG(st.st_mode):
                os.fsync(fd)
        except OSError as e:
            if keep:
                raise OutputWriteError(e) from e
        finally:
            os.close(fd)


def _claim(path: str) -> tuple[int, bool]:
    """Opens and locks the output, creating it if needed; returns (fd, created)."""
    for _ in range(10):
        try:
            try:
                flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL
                fd, created = os.open(path, flags, 0o666), True  # as open() would, less umask
            except FileExistsError:
                fd, created = os.open(path, os.O_RDWR | os.O_APPEND), False
        except FileNotFoundError as e:
            if os.path.lexists(path):  # removed between the two opens: try again
                continue
            folder = os.path.dirname(path) or "."
            reason = f"folder {folder!r} does not exist"
            raise InputError(f"cannot write output {path!r}: {reason}") from e
        except OSError as e:
            raise InputError(f"cannot write output {path!r}: {e.strerror}") from e
        try:
            lock_output(fd, path)
        except BaseException:
            os.close(fd)
            raise
        # A run that created the output may remove it before releasing its lock; the lock taken
        # then is on a file no longer at this path.
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd, created
        os.close(fd)
    raise InputError(f"cannot claim output {path!r}: it keeps being replaced")


def _check_writable(fd: int, path: str) -> None:
    """Raises InputError for an output that opened for writing but takes no write (a /proc
    file): a write of no bytes fails there as a record's would, and changes nothing elsewhere."""
    try:
        os.write(fd, b"")
    except OSError as e:
        raise InputError(f"cannot write output {path!r}: {e.strerror}") from e


def refuse_input_as_output(input_path: str | None, output: str, role: str = "input") -> None:
    """Raises InputError if the output ('-': stdout) is the file input_path ('-': stdin): the
    input, or another file the command reads (its role), also through a link or another path."""
    if input_path is not None and same_file(input_path, output):
        where = "stdout" if output == "-" else repr(output)
        raise InputError(f"the output {where} is the {role} {input_path!r}; write it elsewhere")


def same_file(path: str, output: str) -> bool:
    """Whether path ('-': stdin) and output ('-': stdout) are one regular file, also through a
    link or another spelling; False where either is not there (yet)."""
    path_stat, output_stat = _stat_of(path, sys.stdin), _stat_of(output, sys.stdout)
    if path_stat is None or output_stat is None or not stat.S_ISREG(path_stat.st_mode):
        return False
    return os.path.samestat(path_stat, output_stat)


def _stat_of(path: str, std: object) -> os.stat_result | None:
    """The file at path ('-': the std stream's), None where there is none."""
    try:
        if path != "-":
            return os.stat(path)
        fd = _fd_of(std)
        return None if fd is None else os.fstat(fd)
    except OSError:
        return None


def _fd_of(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
