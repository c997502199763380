"""The GPU profile's runs of engine steps (bench.profile_steps): the torch.profiler glue on the
CPU (guarding it against API drift), which steps each window holds, the bench that leaves it out
on a CPU, and on a real GPU, where one is present, figures in range."""

import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.bench import benchmark
from pagedgen.entrypoints.bench.benchmark import BenchOptions
from pagedgen.entrypoints.bench.gpu_profile import GpuProfile
from pagedgen.entrypoints.bench.profile_steps import profile_decode_steps, profile_mixed_steps
from pagedgen.entrypoints.bench.report import gpu_profile_line, render
from pagedgen.entrypoints.cli.main import app


def test_the_glue_runs_on_the_cpu_and_leaves_the_engine_as_it_was(tiny_llama_path):
    """Real torch.profiler, CPU activity only: the decode steps are found and annotated, and
    with no device traced the busy share is None (not 0: nothing measured it) and no launch is
    counted."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.engines import run_pagedgen
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01)
    workload = random_workload(llm.tokenizer, 4, 24, 12)
    before = run_pagedgen(llm, workload)
    engine = llm.engine
    profile = profile_decode_steps(llm, workload, 3)
    assert profile.num_steps == 3 and profile.window_s > 0
    assert profile.busy_s is None and profile.busy_perc is None
    assert profile.plain_step_s > 0 and profile.plain_busy_perc is None  # timed, nothing traced
    assert profile.num_kernel_launches == profile.num_graph_launches == 0
    # decode steps 3, 4 and 5 of 4 sequences of 24 prompt tokens read 27, 28 and 29 tokens each
    assert profile.kv_tokens == 4 * (27 + 28 + 29)
    assert profile.num_tokens == 4 * 3  # a row for each sequence in each of them
    assert "execute" not in vars(engine.runner) and "step" not in vars(engine)
    assert not engine.requests and not engine.rejected and not engine.has_unfinished_requests()
    assert run_pagedgen(llm, workload).output_token_ids == before.output_token_ids

    # 11 decode steps after the prefill: less the one that opens the window and the warm-up
    assert profile_decode_steps(llm, workload, 100).num_steps == 11 - 2
    one_token = random_workload(llm.tokenizer, 2, 8, 1)  # no decode step at all
    assert profile_decode_steps(llm, one_token, 3).num_steps == 0


def test_the_window_is_a_full_batch_decoding_with_nothing_waiting(tiny_llama_path):
    """More requests than max_num_seqs: only the first max_num_seqs run, so every step after
    their prefill decodes the full batch and none is a waiting request's prefill."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01, max_num_seqs=2)
    workload = random_workload(llm.tokenizer, 5, 24, 12)
    profile = profile_decode_steps(llm, workload, 100)
    assert profile.num_steps == 11 - 2  # as with 2 requests alone
    # 2 sequences; decode steps 3 to 11 read 27 to 35 tokens each
    assert profile.kv_tokens == 2 * sum(range(27, 36))
    assert profile.num_tokens == 2 * 9
    assert not llm.engine.has_unfinished_requests()


def test_mixed_steps_are_those_that_add_prompts_to_a_running_batch(tiny_llama_path):
    """The whole workload runs; once a request finishes, the next ones' prompts join the batch:
    the window holds those steps only, each with its host sections."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01, max_num_seqs=2)
    workload = random_workload(llm.tokenizer, 6, 24, 12)
    workload.max_tokens = [3, 30, 3, 3, 3, 3]  # request 2 decodes while the others take turns
    profile = profile_mixed_steps(llm, workload, 100)
    # requests 1, 3, 4, 5 and 6 prefill in steps 1, 4, 7, 10 and 13, beside request 2's decodes;
    # the window opens once request 1 finishes (step 3), and its first step (4) warms up
    assert profile.phase == "mixed" and profile.num_steps == 3
    host = dict(profile.host_s)
    assert {"scheduler", "prepare_inputs", "model_forward", "detokenize_stop"} <= set(host)
    assert 0 < sum(host.values()) <= profile.window_s
    assert not llm.engine.has_unfinished_requests()
    decode = profile_decode_steps(llm, workload, 3)
    assert decode.phase == "decode" and "model_forward" in dict(decode.host_s)


def test_a_cpu_bench_neither_profiles_nor_prints_it(tiny_llama_path, tmp_path, monkeypatch):
    def fail(*args: object) -> None:
        raise AssertionError("the GPU profile ran on the CPU")

    monkeypatch.setattr(benchmark, "profile_decode_steps", fail)
    monkeypatch.setattr(benchmark, "profile_mixed_steps", fail)
    out = tmp_path / "bench.json"
    args = ["bench", "-m", str(tiny_llama_path), "--workload", "fixed", "--num-prompts", "2"]
    args += ["--input-len", "8", "--output-len", "3", "--kv-cache-memory", "0.01"]
    args += ["--baselines", "", "--no-roofline", "--no-overhead", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "GPU" not in result.output
    report = json.loads(out.read_text())
    assert report["gpu_profile"] is None and report["gpu_profile_mixed"] is None

    report["gpu_profile"] = GpuProfile(4, 0.01, 0.005, 40, 0).to_dict()  # as a cuda run has it
    console = Console(record=True, width=200)
    render(report, console)
    assert "GPU busy 50.0 % over 4 decode steps" in console.export_text()


def test_bench_options_reject_no_profiled_steps():
    with pytest.raises(ValueError, match="gpu_profile_steps"):
        BenchOptions(gpu_profile_steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_bench_reports_busy_share_and_launches(tiny_llama_path):
    options = BenchOptions(
        EngineConfig(str(tiny_llama_path), dtype="float32", device="cuda", kv_cache_memory=0.01),
        workload="fixed",
        num_prompts=8,
        input_len=16,
        output_len=12,
        baselines=[],
        roofline=False,
        overhead=False,
        gpu_profile_steps=4,
    )
    report = benchmark.run_bench(options, log=lambda message: None)
    profile = report["gpu_profile"]
    assert profile["num_steps"] == 4 and profile["window_s"] > 0
    assert 0 < profile["busy_perc"] <= 100 and 0 < profile["plain_busy_perc"] <= 100
    assert profile["kernel_launches_per_step"] > 0
    assert profile["graph_launches_per_step"] == 0  # heads of 16: no cupy kernels, no graphs
    assert profile["kernel_s"] and 0 <= profile["sync_wait_perc"] <= 100
    assert profile["kv_tokens"] > 0 and profile["bound"]["ratio"] > 1  # host-bound tiny steps
    assert profile["bound"]["floor_ratio"] > 1 and profile["bound"]["peak_tflops"] > 0
    assert gpu_profile_line(profile).startswith("GPU busy ")
    assert "model_forward" in profile["host_s"]
    assert report["gpu_profile_mixed"]["phase"] == "mixed"  # all finish at once: no such step
