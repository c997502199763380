"""Steps with prefill rows replayed piecewise: the model's forward captured as graphs between its
attention calls, which run eagerly over the step's own metadata (vLLM's PIECEWISE CUDA graphs).

Decode graphs (cuda_graphs.DecodeGraphs) bake attention's launch shapes in, which fits steps of
one query row a sequence only. A step with prefill rows (new prompts joining running decodes,
chunked prefills, drafts) runs eagerly, a kernel launch from Python for every op of every layer.
Here everything but attention is captured once per bucket of token counts: what attention reads
and writes goes through persistent buffers (the piece before it copies q, k and v in; the piece
after reads its output), so a step replays its bucket's pieces with attention launched between
them, as the eager forward would launch it.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import torch
from torch import nn

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.config import MAX_CUDAGRAPH_CAPTURE_SIZE
from pagedgen.worker.cpu_graphs import CaptureRefused
from pagedgen.worker.cuda_graphs import InputBuffer

MAX_NUM_TOKENS = MAX_CUDAGRAPH_CAPTURE_SIZE
# The rows an eager GEMM pads to on a GPU (layers/linear.gemm_rows): a step runs the GEMMs it
# would run eagerly. Past COARSE_FROM tokens, buckets are 4 steps apart, as gemm_rows' are.
TOKEN_STEP = 32
COARSE_FROM = 1024


def piecewise_token_sizes(max_num_tokens: int, step: int = TOKEN_STEP) -> list[int]:
    """step, 2 * step, ... up to COARSE_FROM, then every 4 * step, up to max_num_tokens, which
    is always one."""
    fine = range(step, min(max_num_tokens, COARSE_FROM + 1), step)
    coarse = range(COARSE_FROM + 4 * step, max_num_tokens, 4 * step)
    return sorted({*fine, *coarse, max_num_tokens})


class Pieces(Protocol):
    """How a piecewise capture records the ops between two attention calls: a CUDA graph
    (cuda_graphs.CudaPieces) or a CPU recording (cpu_graphs.CpuPieces)."""

    def session(self) -> AbstractContextManager[None]:
        """Around every capture of one bucket (and its warm-up run)."""

    def begin(self) -> None:
        """Starts recording a piece."""

    def end(self) -> Callable[[], None]:
        """Stops recording; returns the piece's replay."""

    def poison(self) -> None:
        """Overwrites with NaN whatever the bucket's pieces computed, where it can: a replay
        must recompute all of it (a no-op for CUDA graphs)."""


class StepState:
    """What the attention between two pieces reads of the step being replayed. The pieces hold
    it, not the PiecewiseGraphs that holds them: no reference cycle keeps a dropped engine's
    model and pool alive until a garbage collection (or for good, once gc.freeze ran)."""

    __slots__ = ("metadata", "num_tokens")

    def __init__(self) -> None:
        self.metadata: AttentionMetadata | None = None
        self.num_tokens = 0


class PiecewiseGraphs:
    """The model's forward for steps of up to max(token_sizes) tokens, replayed from pieces
    captured once per bucket of token_sizes.

    Inputs go through one int64 InputBuffer (cuda_graphs.py), for M = the largest bucket:

        [0, M) input_ids | [M, 2M) positions | [2M, 3M) slot_mapping

    A step of n tokens replays the smallest bucket b >= n: rows n..b are padding, token 0 at
    position 0 written to pad_block (a block the block manager never hands out); attention
    runs over the step's n rows only, and the padding rows' attention output is stale.
    Attention's q, k, v and output live in buffers of M rows, one per row shape, shared by every
    layer and bucket: the pieces of different buckets never run at once.
    """

    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        token_sizes: list[int],
        block_size: int,
        pad_block: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.token_sizes = token_sizes
        self.max_num_tokens = m = token_sizes[-1]
        self.block_size = block_size
        self.pad_block = pad_block
        self.pad_slot = pad_block * block_size
        self.inputs = InputBuffer(3 * m, torch.int64, device)
        self.buffer = self.inputs.device
        self.attention_buffers: dict[tuple, torch.Tensor] = {}
        self.replays: dict[int, tuple[list[Callable[[], None]], torch.Tensor]] = {}
        self.state = StepState()  # the step's, for attention

    def describe(self) -> str:
        kind = "CUDA graphs" if self.buffer.is_cuda else "CPU recordings"
        return f"piecewise {kind} (steps of up to {self.max_num_tokens} tokens)"

    def bucket(self, num_tokens: int) -> int:
        return next(size for size in self.token_sizes if size >= num_tokens)

    @property
    def input_ids(self) -> torch.Tensor:
        """The buffer's input_ids, on the device: fill() writes them, and the runner then
        writes the placeholders' tokens."""
        return self.buffer[: self.max_num_tokens]

    def fill(self, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray) -> int:
        """Writes a step's tokens and the padding up to its bucket b into the buffer; returns
        b."""
        n = len(input_ids)
        b = self.bucket(max(n, 1))
        m = self.max_num_tokens
        segments = [(0, input_ids, 0), (m, positions, 0), (2 * m, slot_mapping, self.pad_slot)]
        _, twin = self.inputs.fill(segments, n, b)
        self.inputs.copy(twin, 3 * m)
        return b

    def replay(self, batch_size: int, metadata: AttentionMetadata, num_tokens: int) -> torch.Tensor:
        """Runs bucket batch_size's pieces and attention over metadata's num_tokens rows (the
        backend prepared for it); the first num_tokens rows of the final hidden states (a view
        of the bucket's output, valid until the next replay)."""
        steps, output = self.replays[batch_size]
        self.state.metadata, self.state.num_tokens = metadata, num_tokens
        for step in steps:
            step()
        return output[:num_tokens]

    def capture(self, pieces: Pieces) -> None:
        """Captures every bucket, largest first, over padding-only inputs; raises
        CaptureRefused where a replay does not give what the forward gave."""
        with torch.inference_mode():
            for size in reversed(self.token_sizes):
                with pieces.session():
                    self.replays[size] = self._capture(pieces, size)

    def _capture(self, pieces: Pieces, b: int) -> tuple[list[Callable[[], None]], torch.Tensor]:
        empty = np.zeros(0, dtype=np.int64)
        self.fill(empty, empty, empty)
        metadata = self._padding_metadata(b)
        self.backend.prepare(metadata)
        state = self.state
        state.metadata, state.num_tokens = metadata, b
        attend = self.backend.attend

        def warm_up(spec, query, key, value, *args, **kwargs):
            for role, x in (("q", query), ("k", key), ("v", value), ("out", query)):
                self._attention_buffer(x, role)  # allocated here, outside any piece
            return attend(spec, query, key, value, *args, **kwargs)

        steps: list[Callable[[], None]] = []

        def split(spec, query, key, value, key_cache, value_cache, metadata):
            inputs = (query, key, value)
            buffers = [self._attention_buffer(x, role)[:b] for x, role in zip(inputs, "qkv")]
            for buffer, x in zip(buffers, inputs):
                buffer.copy_(x)
            out = self._attention_buffer(query, "out")[:b]
            steps.append(pieces.end())

            def attention() -> None:
                n = state.num_tokens
                q, k, v = (buffer[:n] for buffer in buffers)
                attend(spec, q, k, v, key_cache, value_cache, state.metadata, out=out[:n])

            steps.append(attention)
            attention()
            pieces.begin()
            return out

        self.backend.attend = warm_up  # the instance's, over the class's method
        try:
            # Kernels compiled, allocator settled, buffers made; and what a replay must give:
            # a CUDA capture records its kernels without running them.
            expected = self._forward(b, metadata).clone()
        finally:
            del self.backend.attend
        self.backend.attend = split  # the instance's, over the class's method
        try:
            pieces.begin()
            output = self._forward(b, metadata)
            steps.append(pieces.end())
        finally:
            del self.backend.attend
        pieces.poison()
        for step in steps:
            step()
        if not torch.equal(output, expected):
            raise CaptureRefused(
                "a piecewise replay differs from the eager forward: part of it ran outside "
                "what the pieces and attention recompute"
            )
        return steps, output

    def _forward(self, b: int, metadata: AttentionMetadata) -> torch.Tensor:
        m = self.max_num_tokens
        return self.model(self.buffer[:b], self.buffer[m : m + b], metadata)

    def _attention_buffer(self, like: torch.Tensor, role: str) -> torch.Tensor:
        """The M-row buffer of role (q, k, v or out) for rows shaped as like's."""
        key = (role, tuple(like.shape[1:]), like.dtype)
        buffer = self.attention_buffers.get(key)
        if buffer is None:
            shape = (self.max_num_tokens, *like.shape[1:])
            buffer = torch.zeros(shape, dtype=like.dtype, device=like.device)
            self.attention_buffers[key] = buffer
        return buffer

    def _padding_metadata(self, b: int) -> AttentionMetadata:
        """b decode rows of one token each, at the padding slot: what a capture attends. Its
        slot_mapping is the buffer's, which the pieces' cache writes read from then on."""
        m, device = self.max_num_tokens, self.buffer.device
        return AttentionMetadata(
            slot_mapping=self.buffer[2 * m : 2 * m + b],
            cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device=device),
            context_lens=torch.ones(b, dtype=torch.int32, device=device),
            block_tables=torch.full((b, 1), self.pad_block, dtype=torch.int32, device=device),
            max_seqlen_q=1,
            max_context_len=1,
            block_size=self.block_size,
            num_decode_seqs=b,
            query_lens_cpu=[1] * b,
            context_lens_cpu=[1] * b,
        )
