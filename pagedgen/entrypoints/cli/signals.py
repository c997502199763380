import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console


class Stoppable(Protocol):
    num_stop_requests: int

    def stop(self) -> None: ...


class Interrupted(BaseException):
    """A stop signal that cannot wait for the job: one during start-up, or a third one. A
    BaseException, as KeyboardInterrupt is: raised wherever the main thread happens to be, it must
    not be taken for an error by library code that catches Exception (a tokenizer's loading, a
    prompt's per-line checks)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Ctrl-C (SIGINT), SIGTERM (what Slurm, Kubernetes and systemd send before SIGKILL) and
    SIGHUP, handled alike. While a job is set, the first asks it to stop admitting requests and
    the second to stop at once; otherwise (during start-up, or a third time) they raise
    Interrupted. A signal the process was started ignoring (nohup) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.job: Stoppable | None = None
        self.signum: int | None = None  # the first received
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGINT).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + (self.signum or signal.SIGINT)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        if self.job is None or self.job.num_stop_requests >= 2:
            raise Interrupted(signum)
        self.job.stop()


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # as for a tool SIGPIPE killed: stdout's reader went


def stdout_reader_gone(console: "Console") -> int:
    """After a BrokenPipeError on stdout (`| head`): says so on stderr and returns 141; stdout
    becomes /dev/null, so that the interpreter's flush at exit raises nothing more."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    console.print("stopped: the reader of stdout closed it")
    return EXIT_BROKEN_PIPE
