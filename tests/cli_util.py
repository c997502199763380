"""Helpers for the CLI tests: run `pagedgen` in a subprocess, read JSONL outputs."""

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

# One OpenMP thread: on a busy machine a second spinning thread makes a tiny model 100x slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
COMMAND = [sys.executable, "-m", "pagedgen.entrypoints.cli"]


def pagedgen(*args: str, stdin: str | bytes | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=not isinstance(stdin, bytes),
        timeout=300,
        env={**ENV, **kwargs.pop("env", {})},
        **kwargs,
    )


def default_signals() -> None:
    """Resets the stop signals in a child: a test run started in the background (`cmd &` from a
    non-interactive shell) ignores SIGINT, and pagedgen, as nohup asks, keeps a signal it was
    started ignoring ignored."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(*args: str, **kwargs) -> subprocess.Popen:
    """pagedgen as a subprocess that the tests signal."""
    return subprocess.Popen(
        [*COMMAND, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
        preexec_fn=default_signals,
        **kwargs,
    )


def tiny(model: Path, max_tokens: int = 5) -> list[str]:
    """Options for a fast greedy run of the tiny test model."""
    return [
        "--model", str(model), "--kv-cache-memory", "0.01", "--max-tokens", str(max_tokens),
        "--temperature", "0", "--no-progress",
    ]  # fmt: skip


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_in_process(capsys, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """Runs the CLI in this process (no interpreter start-up); returns (code, stdout, stderr)."""
    import torch

    from pagedgen.entrypoints.cli.main import app

    saved, threads = sys.stdin, torch.get_num_threads()
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    torch.set_num_threads(1)
    try:
        app(args=list(args), prog_name="pagedgen")
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdin = saved
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
