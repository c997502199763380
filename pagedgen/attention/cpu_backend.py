from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedgen.attention.backend import split_qkv
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.spec import AttentionSpec, spec_options
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.kernels import cpu_ops
from pagedgen.kernels.cpu import (
    ACTIVATION_DTYPES,
    amx_error,
    amx_supports,
    cpu_kernel_error,
    kernel_dtypes,
    paged_attention_decode,
    paged_attention_prefill,
)
from pagedgen.layers.rotary import Rope


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with decode and prefill rows served by our C kernels: one call per layer
    each for the whole batch, reading each sequence's blocks in place, where the torch path
    gathers them and calls SDPA once per sequence. The kernels read float32, bfloat16, float16
    and 8-bit float caches and compute in float32; they take a float32 or bfloat16 query and
    output as they are, a float16 one converted around them."""

    name = "cpu"

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        # bfloat16 prompt rows go to the AMX kernel where the CPU has AMX (amx_supports)
        self.amx = amx_error() is None
        if device.type != "cpu":
            raise RuntimeError(f"the cpu attention backend runs on the CPU only, got {device}")
        error = cpu_kernel_error()
        if error is not None:
            raise RuntimeError(f"the cpu attention kernel is unavailable: {error}")

    def forward_qkv(
        self,
        spec: AttentionSpec,
        qkv: torch.Tensor,
        rope: Rope | None,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """RoPE (whole heads, partial, or none) and the cache write in one C pass over the QKV
        rows, then attention on q, k and v as views of those rows."""
        if not (cpu_ops.usable(qkv) and qkv.stride(1) == 1):
            return super().forward_qkv(spec, qkv, rope, key_cache, value_cache, metadata)
        num_tokens = qkv.shape[0]
        cpu_ops.rotary_embedding_and_cache(
            qkv,
            None if rope is None else rope.cos.view(num_tokens, -1),
            None if rope is None else rope.sin.view(num_tokens, -1),
            spec.num_heads,
            spec.num_kv_heads,
            key_cache,
            value_cache,
            metadata.slot_mapping,
        )
        q, k, v = split_qkv(qkv, spec.num_heads, spec.num_kv_heads)
        return self.attend(spec, q, k, v, key_cache, value_cache, metadata)

    def prepare(self, metadata: AttentionMetadata) -> None:
        super().prepare(metadata)
        self._plan: PrefillPlan | None = None  # this step's, made by its first layer

    @staticmethod
    def _run(
        kernel: Callable[..., torch.Tensor],
        query: torch.Tensor,
        out: torch.Tensor,
        *args: object,
        **options: object,  # window, softcap, sinks, alibi_slopes
    ) -> None:
        """kernel(out, query, *args) on rows of the step, a float16 query (and its result)
        converted to float32 around it."""
        result = out
        if query.dtype not in ACTIVATION_DTYPES:
            query, result = query.float(), torch.empty(query.shape, dtype=torch.float32)
        kernel(result, query, *args, **options)
        if result.data_ptr() != out.data_ptr():
            out.copy_(result)

    def decode(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        if key_cache.dtype not in kernel_dtypes():
            super().decode(spec, query, key_cache, value_cache, metadata, out)
            return
        n = metadata.num_decode_seqs
        cache = (key_cache, value_cache, metadata.block_tables, metadata.context_lens, spec.scale)
        self._run(paged_attention_decode, query[:n], out[:n], *cache, **spec_options(spec))

    def prefill(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        """The step's prompt rows in one call of the tiled kernel (kernels/prefill_attention_cpu.c;
        this step's K/V are in the cache already), in place of one SDPA call per sequence. On a
        CPU with AMX, bfloat16 rows go to the AMX kernel instead (prefill_attention_amx.c). Rows
        past a prompt (drafts to verify, a recomputed output) go through the decode kernel, each
        a decode row over its causal context, as the decode steps that made them did: outputs
        stay those of plain decoding, bit for bit."""
        if key_cache.dtype not in kernel_dtypes():
            super().prefill(spec, query, key, value, key_cache, value_cache, metadata, out)
            return
        n = metadata.num_decode_seqs  # decode rows: one each, before the prefill rows
        query, out = query[n:], out[n:]
        if self._plan is None:
            self._plan = prefill_plan(metadata)
        plan = self._plan
        options, scale = spec_options(spec), spec.scale
        if plan.prompt is not None:
            cache = (key_cache, value_cache, *plan.prompt, scale)
            amx = self.amx and amx_supports(query, key_cache)
            self._run(paged_attention_prefill, query, out, *cache, **options, amx=amx)
        if plan.sampled is not None:
            rows, tables, lens = plan.sampled
            cache = (key_cache, value_cache, tables, lens, scale)
            if rows is None:  # every prefill row
                self._run(paged_attention_decode, query, out, *cache, **options)
                return
            result = torch.empty((len(rows), *out.shape[1:]), dtype=out.dtype)
            self._run(paged_attention_decode, query[rows], result, *cache, **options)
            out.index_copy_(0, rows, result)


class PrefillPlan(NamedTuple):
    """How the cpu backend attends a step's prefill rows (numbered from the first)."""

    # Prompt rows, by the tiled kernel: (block tables, query starts, query lengths, context
    # lengths) of the sequences that have any.
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Rows past a prompt, by the decode kernel (as the decode steps that made them): (the rows,
    # None for all of them; each row's block table; its causal context length).
    sampled: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None


def prefill_plan(metadata: AttentionMetadata) -> PrefillPlan:
    first, num_seqs = metadata.num_decode_seqs, metadata.num_seqs
    prompt_lens = metadata.prompt_lens_cpu
    seqs, starts, lens, contexts = [], [], [], []
    rows, row_seqs, row_lens = [], [], []
    offset = 0
    for i in range(first, num_seqs):
        query_len, context_len = metadata.query_lens_cpu[i], metadata.context_lens_cpu[i]
        start = context_len - query_len
        n = query_len if prompt_lens is None else min(query_len, max(0, prompt_lens[i] - start))
        if n:
            seqs.append(i), starts.append(offset), lens.append(n), contexts.append(start + n)
        rows.extend(range(offset + n, offset + query_len))
        row_seqs.extend([i] * (query_len - n))
        row_lens.extend(range(start + n + 1, context_len + 1))
        offset += query_len

    def int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    prompt = sampled = None
    if seqs:
        tables = metadata.block_tables.index_select(0, torch.tensor(seqs))
        prompt = (tables, int32(starts), int32(lens), int32(contexts))
    if rows:
        tables = metadata.block_tables.index_select(0, torch.tensor(row_seqs))
        every = len(rows) == offset
        sampled = (None if every else torch.tensor(rows), tables, int32(row_lens))
    return PrefillPlan(prompt, sampled)
