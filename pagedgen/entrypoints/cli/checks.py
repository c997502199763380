"""What `pagedgen run` checks before it loads a model or touches its output: every mistake a
user can make there is one line and exit 2, found in a second instead of after a long start-up."""

import glob
import math
import os
import sys

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.io.output_file import same_file

GIB = 1 << 30


def fill_closed_std_fds() -> None:
    """Opens /dev/null on a closed stdin, stdout or stderr (<&-, >&-), so that no file the run
    opens takes fd 0, 1 or 2, where a library writing to "stdout" would write into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one


def check_engine_fits(config: EngineConfig) -> None:
    """Raises ValueError for an engine this machine cannot run: a GPU device or backend without
    a GPU, a KV cache (and swap pool) on the CPU larger than the memory available."""
    for name in ("kv_cache_memory", "swap_space"):
        value = getattr(config, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    has_cuda = cuda_available()
    if config.device.startswith("cuda") and not has_cuda:
        raise ValueError(f"--device {config.device}: torch sees no CUDA GPU on this machine")
    on_gpu = config.device.startswith("cuda") or (config.device == "auto" and has_cuda)
    if config.attention_backend == "cupy" and not on_gpu:
        why = "--device is cpu" if has_cuda else "torch sees none on this machine"
        raise ValueError(f"--attention-backend cupy runs on a CUDA GPU, and {why}")
    if on_gpu or config.kv_cache_memory is None:
        return
    available = mem_available_gib()
    needed = config.kv_cache_memory + config.swap_space
    if available is not None and needed > available:
        raise ValueError(
            f"--kv-cache-memory {config.kv_cache_memory:g} GiB (+ --swap-space "
            f"{config.swap_space:g}) is more than the {available:.1f} GiB of memory available"
        )


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch (a second) on a machine with no
    NVIDIA device file: the CLI answers a usage error or an empty input at once there."""
    if not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/proc/driver/nvidia"):
        return False
    import torch

    return torch.cuda.is_available()


def mem_available_gib() -> float | None:
    """The memory the kernel says a new allocation can take (Linux MemAvailable), in GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_writable_folder(path: str, option: str) -> None:
    """Raises ValueError unless the file path can be created: its folder exists and is writable."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path!r}: folder {folder!r} is not writable")


def check_stats_json(stats_json: str, input_path: str, output: str) -> None:
    """Raises ValueError unless --stats-json can take the summary: '-' (stdout) where the records
    do not go there, else a file that can be created and is neither the input nor the output."""
    if stats_json == "-":
        if output == "-":
            raise ValueError(
                "--stats-json - and -o - both write to stdout, which carries only the records; "
                "give --stats-json a file"
            )
        if sys.stdout is None:
            raise ValueError("--stats-json -: stdout is closed; give --stats-json a file")
        return
    check_writable_folder(stats_json, "--stats-json")
    if same_file(input_path, stats_json):
        raise ValueError(f"--stats-json {stats_json!r} is the input {input_path!r}")
    not_there_yet = output != "-" and not os.path.exists(output)
    if same_file(stats_json, output) or (
        not_there_yet and os.path.realpath(output) == os.path.realpath(stats_json)
    ):
        where = "stdout" if output == "-" else repr(output)
        raise ValueError(f"--stats-json {stats_json!r} is the output {where}")
