"""CPU graphs (engine/cpu_graphs.py): a recorded forward replays the kernel calls and torch ops
it made, from whatever its inputs hold now, and refuses a forward it could not replay; decode
steps replayed from them give the eager engine's outputs."""

import random
import weakref

import pytest
import torch

from pagedgen import LLM, SamplingParams
from pagedgen.kernels import cpu_features, cpu_gemm, cpu_ops
from pagedgen.kernels.call_list import CallList
from pagedgen.kernels.cpu_build import record_calls
from pagedgen.layers import linear
from pagedgen.worker.cpu_graphs import (
    CaptureRefused,
    CpuGraph,
    cpu_graph_batch_sizes,
    cpu_graph_capture,
)
from pagedgen.worker.cuda_graphs import DecodeGraphs
from tests.worker.test_async_scheduling import ENGINE, outputs, prompts_of

needs_cpu_ops = pytest.mark.skipif(
    cpu_ops.cpu_ops_error() is not None, reason=f"no C kernels here: {cpu_ops.cpu_ops_error()}"
)


def test_batch_sizes():
    assert cpu_graph_batch_sizes(256) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert cpu_graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert cpu_graph_batch_sizes(5) == [1, 2, 4, 5]
    assert cpu_graph_batch_sizes(1) == [1]


@needs_cpu_ops
def test_record_calls_reports_each_kernel_call_inside_only():
    x, weight, seen = torch.randn(3, 8), torch.ones(8), []
    with record_calls(lambda fn, args, status: seen.append((fn.__name__, args, status))):
        out = cpu_ops.rms_norm(x, weight, 1e-6)
    cpu_ops.rms_norm(x, weight, 1e-6)
    assert len(seen) == 1
    name, args, status = seen[0]
    assert (name, status) == ("rms_norm_f32", 0)
    assert args[:2] == (out.data_ptr(), x.data_ptr())


@needs_cpu_ops
@torch.inference_mode()
def test_replay_recomputes_kernel_calls_and_torch_ops_from_new_inputs():
    torch.manual_seed(0)
    ids, table, weight = torch.zeros(4, dtype=torch.int32), torch.randn(10, 32), torch.randn(32)

    def run() -> torch.Tensor:
        x = table[ids.long()]  # torch ops returning new tensors
        y = cpu_ops.rms_norm(x, weight, 1e-6)  # a C kernel into an empty tensor
        y[:, :4].mul_(2.0)  # in place, through a view
        return y + 1.0

    graph = CpuGraph(run)
    for values in ([3, 1, 4, 1], [9, 2, 6, 5]):
        ids.copy_(torch.tensor(values, dtype=torch.int32))
        graph.replay()
        assert torch.equal(graph.output, run())
    assert not torch.equal(graph.output[0], graph.output[1])


@needs_cpu_ops
@torch.inference_mode()
def test_consecutive_kernel_calls_replay_as_one_call_list():
    torch.manual_seed(0)
    x, weight = torch.randn(4, 32), torch.randn(32)

    def run() -> torch.Tensor:
        return cpu_ops.rms_norm(cpu_ops.rms_norm(x, weight, 1e-6), weight, 1e-5) * 2.0

    graph = CpuGraph(run)
    assert [type(step) for step in graph.steps][:1] == [CallList]
    x.copy_(torch.randn(4, 32))
    graph.replay()
    assert torch.equal(graph.output, run())


@needs_cpu_ops
@torch.inference_mode()
def test_recordings_share_one_arena_and_each_still_replays_its_own_output():
    """Buckets never run at once: the second recording's kernel outputs reuse the first's
    memory, and replaying either after the other recomputes all it holds."""
    torch.manual_seed(0)
    weight = torch.randn(64)
    inputs = {rows: torch.randn(rows, 64) for rows in (8, 3)}
    capture = cpu_graph_capture()
    graphs = {rows: capture(lambda r=rows: cpu_ops.rms_norm(inputs[r], weight, 1e-6) * 2.0)
              for rows in (8, 3)}  # fmt: skip
    replay8, replay3 = graphs[8][0], graphs[3][0]
    first_kernel_out = [t for t in recorded_tensors(replay8) if t.shape == (8, 64)]
    assert first_kernel_out, "the kernel's output should be one of the recorded tensors"
    assert any(
        t.untyped_storage().data_ptr() == first_kernel_out[0].untyped_storage().data_ptr()
        for t in recorded_tensors(replay3)
    ), "the smaller recording should allocate from the same arena"
    for _ in range(2):
        for rows, (replay, out) in graphs.items():
            inputs[rows].copy_(torch.randn(rows, 64))
            replay()
            assert torch.equal(out, cpu_ops.rms_norm(inputs[rows], weight, 1e-6) * 2.0)


def recorded_tensors(replay) -> list[torch.Tensor]:
    """The tensors a CpuGraph recorded (its replay is the bound method of the graph)."""
    return replay.__self__.results


@torch.inference_mode()
def test_a_value_handed_back_to_python_refuses_the_recording():
    x = torch.randn(8)

    def run() -> torch.Tensor:
        return x * 2 if float(x.sum()) > 0 else x * 3

    with pytest.raises(CaptureRefused, match="hands a value back"):
        CpuGraph(run)


@torch.inference_mode()
def test_work_the_recording_does_not_see_fails_the_check():
    """numpy writing into a tensor's memory reaches neither the dispatcher nor record_calls:
    a replay would leave that tensor as it was."""
    x = torch.randn(8)

    def run() -> torch.Tensor:
        y = torch.empty(8)
        y.numpy()[:] = x.numpy() * 2
        return y + 1

    with pytest.raises(CaptureRefused, match="differs from the eager forward"):
        CpuGraph(run)


def count_replays(llm: LLM) -> list[int]:
    graphs = llm.engine.runner.decode_graphs
    assert graphs is not None, "no CPU graphs were recorded"
    counted, graphs_ref = [0], weakref.ref(graphs)  # a strong one would make a cycle

    def spy(batch_size: int, num_seqs: int) -> torch.Tensor:
        counted[0] += 1
        return DecodeGraphs.replay(graphs_ref(), batch_size, num_seqs)

    graphs.replay = spy
    return counted


@needs_cpu_ops
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_decode_steps_from_cpu_graphs_equal_eager_ones(tiny_llama_path, async_scheduling):
    """Batches from 70 rows (eager) down to 1 (every bucket), seeded sampling and logprobs."""
    rng = random.Random(0)
    prompts = prompts_of(11, 70)
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(2, 40), ignore_eos=True, logprobs=2)
        if i % 2
        else SamplingParams(temperature=0.8, top_k=20, seed=i, max_tokens=rng.randint(2, 40))
        for i in range(len(prompts))
    ]
    eager = outputs(LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True), prompts, params)
    llm = LLM(str(tiny_llama_path), **ENGINE, async_scheduling=async_scheduling)
    assert llm.engine.runner.decode_graphs.batch_sizes == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    replays = count_replays(llm)
    assert outputs(llm, prompts, params) == eager
    assert replays[0] >= 30


def preemption_case(preemption_mode: str) -> tuple[list[list[int]], SamplingParams, dict]:
    """Prompts, params and engine arguments for a pool that preempts every few steps."""
    prompts = prompts_of(3, 12, shared_prefix=20)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    kwargs = dict(block_size=4, preemption_mode=preemption_mode, swap_space=0.01,
                  kv_cache_memory=0.00015, max_num_batched_tokens=48)  # fmt: skip
    return prompts, params, kwargs


@needs_cpu_ops
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_cpu_graphs_through_preemption(tiny_llama_path, preemption_mode):
    """A pool of a few blocks: decode rows are preempted and come back between replays."""
    prompts, params, kwargs = preemption_case(preemption_mode)
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **kwargs), prompts, params
    )
    llm = LLM(str(tiny_llama_path), **ENGINE, **kwargs)
    replays = count_replays(llm)
    assert outputs(llm, prompts, params) == eager
    assert replays[0] > 0
    assert sum(llm.engine.scheduler.num_preemptions.values()) > 0


def test_enforce_eager_records_no_graphs(tiny_llama_path):
    llm = LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True)
    assert llm.engine.runner.decode_graphs is None
    assert isinstance(LLM(str(tiny_llama_path), **ENGINE).engine.runner.decode_graphs, DecodeGraphs)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "dtype", "layout"),
    [
        pytest.param(
            {"PAGEDGEN_DISABLE_CPU_GEMM": "1"},
            "float32",
            linear.ONEDNN,  # what AVX-512 machines run
            marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN"),
        ),
        ({"PAGEDGEN_DISABLE_CPU_OPS": "1"}, "float32", None),  # norms and RoPE as torch ops
        ({}, "bfloat16", None),
    ],
    ids=["onednn-matmuls", "torch-elementwise-ops", "bfloat16"],
)
@needs_cpu_ops
def test_cpu_graphs_over_the_other_cpu_paths(tiny_llama_path, monkeypatch, env, dtype, layout):
    """The paths another CPU takes, forced here: oneDNN's opaque packed weights (what AVX-512
    machines run) and torch's elementwise ops are recorded as torch ops and replay as eager."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caches = (cpu_gemm.enabled, cpu_ops._enabled, cpu_features.onednn_matmul_dtypes)
    for cache in caches:
        cache.cache_clear()
    try:
        engine = dict(ENGINE, dtype=dtype)
        prompts = prompts_of(5, 6)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        eager = outputs(LLM(str(tiny_llama_path), **engine, enforce_eager=True), prompts, params)
        llm = LLM(str(tiny_llama_path), **engine)
        if layout is not None:
            layer = llm.engine.runner.model.layers[0].mlp.down_proj
            assert layer.layout == layout
        replays = count_replays(llm)
        assert outputs(llm, prompts, params) == eager
        assert replays[0] > 0
    finally:
        for cache in caches:
            cache.cache_clear()
