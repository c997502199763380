"""A CPU decode step split into parts (bench.cpu_decode_parts): every Linear role of the model with
its own bytes, times that add up to no more than the step's, and the engine left as it was."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pagedgen.entrypoints.bench.cpu_decode_parts import (
    ATTENTION,
    OTHER,
    OUTSIDE,
    cpu_decode_parts,
    decode_parts_table,
    held_bytes,
    linear_roles,
)
from pagedgen.entrypoints.bench.roofline import Roofline
from pagedgen.entrypoints.cli.main import app


def test_parts_cover_every_linear_role_and_leave_the_engine_as_it_was(tiny_llama_path):
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.engines import run_pagedgen
    from pagedgen.entrypoints.bench.workloads import random_workload

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01)
    runner = llm.engine.runner
    graphs = runner.decode_graphs
    assert graphs is not None  # the CPU replays its decode steps
    workload = random_workload(llm.tokenizer, 4, 24, 12)
    before = run_pagedgen(llm, workload)
    roofline = Roofline({}, {}, peak_gflops=100.0, copy_gbps=10.0, flops_per_token=1.0,
                        weight_bytes_per_step=1.0)  # fmt: skip
    report = cpu_decode_parts(llm, workload, roofline, max_num_steps=4)

    # after a warm-up step timed by part, plain steps and steps timed by part take turns
    assert report["num_steps"] == 2 and report["num_plain_steps"] == 2 and report["num_seqs"] == 4
    parts = report["parts"]
    model = runner.model
    roles = linear_roles(model)
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"} <= set(roles)
    assert set(parts) == {*roles, ATTENTION, OTHER, OUTSIDE}
    for role, modules in roles.items():
        part = parts[role]
        own = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        assert part["weight_bytes"] == own == sum(held_bytes(m) for m in modules)
        assert part["num_layers"] == len(modules) and part["calls_per_step"] == len(modules)
        assert part["rows"] == 4 and part["gb"] == pytest.approx(own / 1e9)
        assert part["ms"] > 0 and part["gflops"] > 0 and part["bound_perc"] > 0
    # decode steps 4 and 6 of 4 sequences of 24 prompt tokens read 28 and 30 tokens each
    assert report["context_tokens"] == 4 * (28 + 30) / 2
    kv_bytes = 4 * (28 + 30) * runner.geometry.bytes_per_token
    assert parts[ATTENTION]["gb"] == pytest.approx(kv_bytes / 2 / 1e9)
    assert all(part["ms"] > 0 for part in parts.values())
    step = report["step"]
    assert sum(part["ms"] for part in parts.values()) <= step["ms"] * (1 + 1e-9)
    assert step["bound_ms"] == pytest.approx(sum(p["bound_ms"] or 0 for p in parts.values()))
    assert report["plain_step"]["ms"] > 0 and report["plain_step"]["bound_perc"] > 0
    assert parts["lm_head"]["bound_by"] in ("bytes", "FLOPs") and parts[OTHER]["bound_by"] is None

    # the engine as it was: graphs back, no hook, no patch, no request; they replay again
    assert runner.decode_graphs is graphs
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all("forward" not in vars(m) for m in model.modules())
    assert "step" not in vars(llm.engine)
    engine = llm.engine
    assert not engine.requests and not engine.rejected and not engine.has_unfinished_requests()
    replays = []
    replay = graphs.replay
    graphs.replay = lambda *args: replays.append(args) or replay(*args)
    try:
        assert run_pagedgen(llm, workload).output_token_ids == before.output_token_ids
    finally:
        del graphs.replay
    assert replays

    text = _rendered(report)
    assert "qkv_proj" in text and "step (plain)" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_cpu_bench_reports_parts_unless_told_not_to(tiny_llama_path, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "-m", str(tiny_llama_path), "--workload", "fixed", "--num-prompts", "2"]
    args += ["--input-len", "8", "--output-len", "6", "--kv-cache-memory", "0.01"]
    args += ["--baselines", "", "--no-roofline", "--no-overhead", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    parts = json.loads(out.read_text())["cpu_decode_parts"]
    assert parts["num_steps"] > 0 and parts["copy_gbps"] is None  # no roofline: no bound
    assert parts["parts"]["lm_head"]["bound_perc"] is None and parts["parts"]["lm_head"]["ms"] > 0
    assert "CPU decode step by part" in result.output

    result = CliRunner().invoke(app, [*args, "--no-decode-parts"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["cpu_decode_parts"] is None
    assert "CPU decode step by part" not in result.output


def _rendered(report: dict) -> str:
    console = Console(record=True, width=200)
    console.print(decode_parts_table(report))
    return console.export_text()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_models_flops_count_every_linear_however_packed(tiny_llama_path, dtype):
    """bfloat16 panels hold their values as int16: a Linear counts by its shape."""
    from pagedgen import LLM
    from pagedgen.entrypoints.bench.roofline import model_costs
    from pagedgen.layers.linear import Linear

    llm = LLM(str(tiny_llama_path), dtype=dtype, kv_cache_memory=0.01, log=lambda m: None)
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert model_costs(model)[0] == 2 * sum(
        m.in_features * m.out_features for m in linears
    ) + 2 * sum(p.numel() for p in norms)
