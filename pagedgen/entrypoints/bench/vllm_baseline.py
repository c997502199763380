"""vLLM's CPU backend as a `pagedgen bench` baseline, run on the identical workload in its own
process (and virtualenv: vLLM pins its own transformers and torch).

The runner is a command taking `--model DIR --workload W.json --dtype D --out R.json
--max-num-seqs N`, as the vllm-cpu-baseline tool of our development machines does. W.json is a
workload file (workload_file.py); R.json vLLM's figures and its output token ids.
PAGEDGEN_VLLM_BASELINE names the command.
"""

import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from pagedgen import envs
from pagedgen.entrypoints.bench.result import RunResult
from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import Workload

ENV_VAR = envs.PAGEDGEN_VLLM_BASELINE


class VllmUnavailable(RuntimeError):
    pass


def baseline_command() -> list[str]:
    """The runner's command line, or VllmUnavailable saying how to provide one."""
    configured = envs.vllm_baseline()
    if configured:
        command = shlex.split(configured)
        if not command or not shutil.which(command[0]):
            raise VllmUnavailable(f"{ENV_VAR}={configured!r} is not an executable command")
        return command
    raise VllmUnavailable(
        f"no vLLM baseline: set {ENV_VAR} to a command running a workload file through vLLM "
        "(see docs/configuration.md)"
    )


def parse_result(data: dict, workload: Workload) -> RunResult:
    """A runner's R.json as a RunResult, checked against the workload it ran."""
    token_ids = [list(ids) for ids in data["output_token_ids"]]
    if len(token_ids) != workload.num_requests:
        raise ValueError(f"vLLM returned {len(token_ids)} outputs for {workload.num_requests}")
    lengths = [len(ids) for ids in token_ids]
    if lengths != list(workload.max_tokens):
        raise ValueError("vLLM's outputs do not have the workload's lengths (was eos ignored?)")
    return RunResult(
        name="vllm",
        elapsed=float(data["elapsed_s"]),
        num_requests=workload.num_requests,
        num_prompt_tokens=workload.num_prompt_tokens,
        num_output_tokens=sum(lengths),
        output_token_ids=token_ids,
        engine=data.get("engine", "vllm"),
    )


def run_vllm(
    model_dir: Path, workload: Workload, dtype: str, max_num_seqs: int, timeout: float = 3600
) -> RunResult:
    """Runs the workload through vLLM, after pagedgen's run, in a separate process."""
    from pagedgen.loader.dense_copy import dense_folder

    command = baseline_command()
    model_dir = dense_folder(model_dir)  # vLLM reads no pagedgen-quantized folder
    if not (model_dir / "config.json").is_file():
        raise VllmUnavailable(
            f"the vLLM baseline needs a Hugging Face model folder, not {model_dir}"
        )
    with tempfile.TemporaryDirectory(prefix="pagedgen-vllm-") as tmp:
        workload_path, out_path = Path(tmp) / "workload.json", Path(tmp) / "result.json"
        save_workload(workload, workload_path)
        args = ["--model", str(model_dir), "--workload", str(workload_path), "--dtype", dtype]
        args += ["--out", str(out_path), "--max-num-seqs", str(max_num_seqs)]
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0 or not out_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise VllmUnavailable(f"the vLLM baseline failed ({done.returncode}): {tail}")
        return parse_result(json.loads(out_path.read_text()), workload)
