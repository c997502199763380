"""A benchmark workload as a JSON file: {"prompts": [[token ids], ...], "max_tokens": [int, ...]}
(greedy, ignore_eos). `pagedgen bench --save-workload` writes it, `--workload FILE.json` runs it,
and the vLLM baseline's runner is given it, so every engine on every machine runs the same
requests: a ShareGPT workload made where the dataset package is installed runs on a GPU machine
that lacks it."""

import json
from pathlib import Path

from pagedgen.entrypoints.bench.workloads import Workload


class WorkloadFileError(ValueError):
    pass


def is_workload_file(name: str) -> bool:
    """Whether a --workload value names a file rather than a built-in workload."""
    return name.endswith(".json") or Path(name).expanduser().is_file()


def workload_file(workload: Workload) -> dict:
    return {"prompts": workload.prompts, "max_tokens": workload.max_tokens}


def save_workload(workload: Workload, path: str | Path) -> None:
    path = Path(path).expanduser()
    try:
        path.write_text(json.dumps(workload_file(workload)) + "\n", encoding="utf-8")
    except OSError as e:
        raise WorkloadFileError(f"cannot write the workload file {path}: {e.strerror}") from e


def read_workload(path: str | Path) -> Workload:
    """The workload a file holds, its shape checked; the token ids are checked against a model's
    vocabulary by check_workload once the model is known."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise WorkloadFileError(f"workload file {path} not found") from e
    except OSError as e:
        raise WorkloadFileError(f"cannot read the workload file {path}: {e.strerror}") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise WorkloadFileError(f"workload file {path} is not JSON: {e}") from e
    if not isinstance(data, dict) or not {"prompts", "max_tokens"} <= set(data):
        raise WorkloadFileError(
            f'workload file {path} must be an object {{"prompts": [[token ids], ...], '
            '"max_tokens": [int, ...]}'
        )
    prompts, max_tokens = data["prompts"], data["max_tokens"]
    if not isinstance(prompts, list) or not isinstance(max_tokens, list) or not prompts:
        raise WorkloadFileError(f"workload file {path}: prompts and max_tokens must be lists")
    if len(prompts) != len(max_tokens):
        raise WorkloadFileError(
            f"workload file {path}: {len(prompts)} prompts but {len(max_tokens)} max_tokens"
        )
    for i, (prompt, k) in enumerate(zip(prompts, max_tokens)):
        if not isinstance(prompt, list) or not prompt or not all(map(_is_token_id, prompt)):
            raise WorkloadFileError(
                f"workload file {path}: prompt {i} is not a non-empty list of token ids"
            )
        if not _is_int(k) or k < 1:
            raise WorkloadFileError(f"workload file {path}: max_tokens {i} is {k!r}, not >= 1")
    return Workload(path.stem, prompts, max_tokens, f"token ids from {path.name}")


def check_workload(workload: Workload, vocab_size: int, max_model_len: int) -> None:
    """Every token id within the model's vocabulary and every request within max_model_len."""
    for i, (prompt, k) in enumerate(zip(workload.prompts, workload.max_tokens)):
        bad = next((t for t in prompt if t >= vocab_size), None)
        if bad is not None:
            raise WorkloadFileError(
                f"workload {workload.name}: prompt {i} holds token id {bad}, outside the model's "
                f"vocabulary (0..{vocab_size - 1})"
            )
        if len(prompt) + k > max_model_len:
            raise WorkloadFileError(
                f"workload {workload.name}: request {i} needs {len(prompt)} + {k} tokens, more "
                f"than max_model_len {max_model_len}"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_id(value: object) -> bool:
    return _is_int(value) and value >= 0
