"""Decode steps replayed as CUDA graphs, one per batch-size bucket, over persistent buffers."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from pagedgen.attention import AttentionMetadata

# Captures run() (its first call may compile and allocate), returning (replay, output): replay()
# recomputes output in place from whatever the buffers run() read now hold.
GraphCapture = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], None], torch.Tensor]]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs, which is always one."""
    sizes = {1, 2, 4, 8, *range(16, max_num_seqs, 16), max_num_seqs}
    return sorted(size for size in sizes if size <= max_num_seqs)


def cuda_graph_capture() -> GraphCapture:
    """Captures into one memory pool shared by every graph of the engine: they never run at
    once, and the largest, captured first, sizes it for the rest."""
    pool = torch.cuda.graph_pool_handle()

    def capture(run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        run()  # compiles the kernels and settles the allocator outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = run()
        return graph.replay, output

    return capture


class InputBuffer:
    """A graph's inputs: one device buffer, filled from two pinned host twins in turn by one
    copy a step. Under async scheduling a step is filled while the one before runs, and a twin
    is rewritten only after the host has waited for the samples of the step that copied it,
    i.e. after that copy ran."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.hosts = [torch.zeros(size, dtype=dtype, pin_memory=pin) for _ in range(2)]
        self.num_fills = 0
        self.device = torch.zeros(size, dtype=dtype, device=device)

    def fill(
        self, segments: list[tuple[int, np.ndarray, int]], n: int, b: int
    ) -> tuple[np.ndarray, torch.Tensor]:
        """The next twin with each (offset, values, pad) segment written: n values, then pad up
        to b; returns it as an array (for more to write) and as the tensor copy() takes."""
        twin = self.hosts[self.num_fills % 2]
        self.num_fills += 1
        host = twin.numpy()
        for offset, values, pad in segments:
            host[offset : offset + n] = values
            host[offset + n : offset + b] = pad
        return host, twin

    def copy(self, twin: torch.Tensor, used: int) -> None:
        self.device[:used].copy_(twin[:used], non_blocking=True)


class DecodeGraphs:
    """The model's forward for decode-only steps of up to max_num_seqs rows, replayed from
    graphs captured once per bucket of graph_batch_sizes (vLLM's and nano-vllm's scheme).

    Every step's inputs go through one int32 buffer on the device, filled from a pinned host
    twin by one copy. Its layout, for M = the largest bucket and W = max_num_blocks_per_seq:

        [0, M) input_ids | [M, 2M) positions | [2M, 3M) slot_mapping | [3M, 4M) context_lens |
        [4M, 4M + M * W) block_tables, row-major

    A step of n rows replays the smallest bucket b >= n; rows n..b are padding: token 0 at
    position 0, written to and read back from pad_block, a block of the pool the block manager
    never hands out, so the padding touches no sequence's K/V.

    Graphs bake in the pool's addresses: they are captured after the pool is allocated and must
    be captured again if it is reallocated.
    """

    def __init__(
        self,
        model: nn.Module,
        block_size: int,
        max_num_blocks_per_seq: int,
        max_num_seqs: int,
        pad_block: int,
        device: torch.device,
        batch_sizes: list[int] | None = None,  # default: graph_batch_sizes(max_num_seqs)
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.pad_block = pad_block
        self.batch_sizes = batch_sizes or graph_batch_sizes(max_num_seqs)
        self.max_batch_size = m = self.batch_sizes[-1]
        self.width = w = max_num_blocks_per_seq
        if (pad_block + 1) * block_size >= 2**31:
            raise ValueError("a pool of 2**31 slots or more does not fit the graphs' int32 slots")
        self.inputs = InputBuffer(4 * m + m * w, torch.int32, device)
        self.buffer = self.inputs.device
        self.cu_seqlens_q = torch.arange(m + 1, dtype=torch.int32, device=device)
        self.replays: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}

    def capture(self, capture: GraphCapture) -> None:
        """Captures every bucket, largest first, over padding-only inputs."""
        empty = np.zeros(0, dtype=np.int64)
        no_tables = np.zeros((0, self.width), dtype=np.int32)
        self.fill(empty, empty, empty, empty, no_tables, empty, self.max_batch_size)
        with torch.inference_mode():
            for batch_size in reversed(self.batch_sizes):
                self.replays[batch_size] = capture(lambda b=batch_size: self._forward(b))

    def describe(self) -> str:
        kind = "CUDA" if self.buffer.is_cuda else "CPU"
        return f"{kind} graphs (batches of up to {self.max_batch_size} rows)"

    def bucket(self, num_seqs: int) -> int:
        return next(size for size in self.batch_sizes if size >= num_seqs)

    def fill(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        context_lens: np.ndarray,
        tables: np.ndarray,  # [num_rows, max_num_blocks_per_seq] int32: BlockTables.table
        rows: np.ndarray,  # [n]: each row's block table in tables
        batch_size: int | None = None,  # default: the smallest bucket that holds the n rows
    ) -> int:
        """Writes a step's n rows and the padding up to its bucket b into the host buffer,
        then copies the buffer's used part to the device; returns b."""
        n = len(input_ids)
        b = batch_size or self.bucket(n)
        m = self.max_batch_size
        segments = [
            (0, input_ids, 0),
            (m, positions, 0),
            (2 * m, slot_mapping, self.pad_block * self.block_size),
            (3 * m, context_lens, 1),
        ]
        host, twin = self.inputs.fill(segments, n, b)
        block_tables = host[4 * m :].reshape(m, self.width)
        np.take(tables, rows, axis=0, out=block_tables[:n])
        block_tables[n:b, 0] = self.pad_block
        self.inputs.copy(twin, 4 * m + b * self.width)
        return b

    @property
    def input_ids(self) -> torch.Tensor:
        """The buffer's input_ids, on the device: fill() writes them, and the runner then
        writes the placeholders' tokens."""
        return self.buffer[: self.max_batch_size]

    def replay(self, batch_size: int, num_seqs: int) -> torch.Tensor:
        """Runs the graph of batch_size over the buffer as filled; the first num_seqs rows of
        the final hidden states (a view of the graph's output, valid until the next replay)."""
        replay, output = self.replays[batch_size]
        replay()
        return output[:num_seqs]

    def _forward(self, b: int) -> torch.Tensor:
        m, buffer = self.max_batch_size, self.buffer
        max_context_len = self.width * self.block_size
        metadata = AttentionMetadata(
            slot_mapping=buffer[2 * m : 2 * m + b].long(),
            cu_seqlens_q=self.cu_seqlens_q[: b + 1],
            context_lens=buffer[3 * m : 3 * m + b],
            block_tables=buffer[4 * m :].view(m, self.width)[:b],
            max_seqlen_q=1,
            max_context_len=max_context_len,
            block_size=self.block_size,
            num_decode_seqs=b,
            query_lens_cpu=[1] * b,
            # Bounds only: kernels read each row's length from context_lens.
            context_lens_cpu=[max_context_len] * b,
        )
        return self.model(buffer[:b].long(), buffer[m : m + b].long(), metadata)


class CudaPieces:
    """PiecewiseGraphs' pieces on a GPU: CUDA graphs sharing one memory pool, captured on a side
    stream (the eager attention between two pieces runs there too)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.graph: torch.cuda.CUDAGraph | None = None

    @contextmanager
    def session(self) -> Iterator[None]:
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            try:
                yield
            finally:
                if torch.cuda.is_current_stream_capturing():  # a failed capture's piece
                    self.graph.capture_end()
        torch.cuda.synchronize()

    def begin(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.graph.capture_begin(pool=self.pool)

    def end(self) -> Callable[[], None]:
        self.graph.capture_end()
        return self.graph.replay

    def poison(self) -> None:
        """Nothing: a graph's intermediates are not tensors the host holds."""
