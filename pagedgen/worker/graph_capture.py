"""Which graphs an engine captures at start-up, and what it says of them."""

import time
from collections.abc import Callable

from pagedgen.config import CompilationConfig
from pagedgen.worker.cpu_graphs import (
    CaptureRefused,
    CpuPieces,
    cpu_graph_batch_sizes,
    cpu_graph_capture,
)
from pagedgen.worker.cuda_graphs import CudaPieces, DecodeGraphs, GraphCapture, cuda_graph_capture
from pagedgen.worker.model_runner import ModelRunner
from pagedgen.worker.piecewise_graphs import (
    TOKEN_STEP,
    Pieces,
    PiecewiseGraphs,
    piecewise_token_sizes,
)

CPU_MAX_NUM_TOKENS = 64  # as CPU decode graphs: past it the Python between kernels is a few %
CPU_TOKEN_STEP = 8


def capture_graphs(
    runner: ModelRunner,
    max_num_seqs: int,
    max_num_tokens: int,
    log: Callable[[str], None],
    compilation_config: CompilationConfig = CompilationConfig(),
) -> None:
    """Captures the decode steps' CUDA graphs, or records their CPU graphs, on the runner's
    device, and, where compilation_config says, the other steps' pieces up to max_num_tokens,
    the scheduler's token budget; a CPU recording that cannot be replayed leaves those steps
    eager, saying why."""
    on_gpu = runner.device.type == "cuda"
    start = time.perf_counter()
    try:
        if on_gpu:
            capture_decode_graphs(runner)
        else:
            capture_decode_graphs(runner, cpu_graph_capture(), cpu_graph_batch_sizes(max_num_seqs))
    except CaptureRefused as e:
        log(f"decode steps run eagerly: {e}")
        return
    log(
        f"decode steps from {runner.decode_graphs.describe()}, captured in "
        f"{time.perf_counter() - start:.1f} s"
    )
    if not compilation_config.piecewise(on_gpu):
        return
    start = time.perf_counter()
    if on_gpu:
        pieces, step = CudaPieces(), TOKEN_STEP
        top = compilation_config.max_cudagraph_capture_size
    else:
        pieces, top, step = CpuPieces(), CPU_MAX_NUM_TOKENS, CPU_TOKEN_STEP
    try:
        capture_piecewise_graphs(
            runner, pieces, piecewise_token_sizes(min(top, max_num_tokens), step)
        )
    except CaptureRefused as e:
        log(f"steps with prefill rows run eagerly: {e}")
        return
    log(
        f"steps with prefill rows from {runner.piecewise_graphs.describe()}, captured in "
        f"{time.perf_counter() - start:.1f} s"
    )


def capture_decode_graphs(
    runner: ModelRunner, capture: GraphCapture | None = None, batch_sizes: list[int] | None = None
) -> None:
    """From now on, the runner's decode-only steps of up to max(batch_sizes) rows replay graphs
    (capture: how to capture one, by default a CUDA graph). A pool allocated without its
    padding block is allocated again, emptied: call it before the first step. With LoRA, a
    second set runs the adapters, for steps that have any (both share one memory pool)."""
    num_blocks = runner.num_blocks
    runner.decode_graphs = runner.lora_decode_graphs = None
    if not runner.has_pad_block:
        runner.allocate_kv_cache(num_blocks, runner.cpu_cache.shape[2], pad_block=True)
    capture = capture or cuda_graph_capture()

    def captured(lora_active: bool) -> DecodeGraphs:
        graphs = DecodeGraphs(
            runner.model,
            runner.block_size,
            runner.block_tables.max_num_blocks_per_seq,
            runner.max_num_seqs,
            pad_block=num_blocks,
            device=runner.device,
            batch_sizes=batch_sizes,
        )
        if runner.lora is not None:
            runner.lora.state.active = lora_active
        graphs.capture(capture)
        return graphs

    lora_graphs = captured(lora_active=True) if runner.lora is not None else None
    runner.decode_graphs = captured(lora_active=False)
    runner.lora_decode_graphs = lora_graphs


def capture_piecewise_graphs(runner: ModelRunner, pieces: Pieces, token_sizes: list[int]) -> None:
    """From now on, the runner's steps of up to max(token_sizes) tokens that no decode graph
    takes (and that run no adapter) replay pieces captured between the attention calls
    (pieces: a cuda_graphs.CudaPieces or cpu_graphs.CpuPieces). Call it after
    capture_decode_graphs, which gives the pool its padding block."""
    assert runner.has_pad_block, "capture_decode_graphs first"
    runner.piecewise_graphs = None
    if runner.lora is not None:
        runner.lora.state.active = False
    graphs = PiecewiseGraphs(
        runner.model,
        runner.backend,
        token_sizes,
        runner.block_size,
        runner.num_blocks,
        runner.device,
    )
    graphs.capture(pieces)
    runner.piecewise_graphs = graphs
