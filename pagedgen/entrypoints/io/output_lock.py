"""One run per output file: an advisory flock, which the kernel drops when its process dies, so
a run killed with SIGKILL leaves no stale lock behind."""

import contextlib
import errno
import fcntl
import os

from pagedgen.entrypoints.io.spec import InputError

# Filesystems that cannot lock (some FUSE and network mounts): the output is used unlocked.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def lock_output(fd: int, path: str) -> None:
    """Locks the open output fd, or raises InputError naming the run that holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = lock_holder(os.fstat(fd))
        run = f"another pagedgen run (PID {pid})" if pid is not None else "another pagedgen run"
        raise InputError(
            f"{run} is writing {path!r}; wait for it to end or write elsewhere"
        ) from None
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise InputError(f"cannot lock output {path!r}: {e.strerror}") from e


def lock_holder(st: os.stat_result) -> int | None:
    """The PID holding an flock on the file, as Linux's /proc/locks tells, if it does."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError, ValueError), open("/proc/locks") as f:
        for entry in f:
            # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2147123 0 EOF"; a waiter's line has a "->"
            fields = entry.split()
            if "FLOCK" in fields and "->" not in fields and key in fields:
                return int(fields[fields.index(key) - 1])
    return None
