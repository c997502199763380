from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedgen.attention.backend import split_qkv
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.torch_backend import TorchAttentionBackend, prefill_sequence
from pagedgen.cpu_features import has_amx_bf16, onednn_matmul_dtypes
from pagedgen.kernels import cpu_ops
from pagedgen.kernels.cpu import (
    ACTIVATION_DTYPES,
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
        # bfloat16 prompts of at least this many tokens go to SDPA (sdpa_prompt_min_tokens)
        self.sdpa_min_tokens = sdpa_prompt_min_tokens()
        if device.type != "cpu":
            raise RuntimeError(f"the cpu attention backend runs on the CPU only, got {device}")
        error = cpu_kernel_error()
        if error is not None:
            raise RuntimeError(f"the cpu attention kernel is unavailable: {error}")

    def forward_qkv(
        self,
        qkv: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        rope: Rope | None,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """RoPE (whole heads, partial, or none) and the cache write in one C pass over the QKV
        rows, then attention on q, k and v as views of those rows."""
        options = (window, softcap, sinks, alibi_slopes)
        if not (cpu_ops.usable(qkv) and qkv.stride(1) == 1):
            args = (num_heads, num_kv_heads, rope, key_cache, value_cache, metadata, scale)
            return super().forward_qkv(qkv, *args, *options)
        num_tokens = qkv.shape[0]
        cpu_ops.rotary_embedding_and_cache(
            qkv,
            None if rope is None else rope.cos.view(num_tokens, -1),
            None if rope is None else rope.sin.view(num_tokens, -1),
            num_heads,
            num_kv_heads,
            key_cache,
            value_cache,
            metadata.slot_mapping,
        )
        q, k, v = split_qkv(qkv, num_heads, num_kv_heads)
        return self.attend(q, k, v, key_cache, value_cache, metadata, scale, *options)

    def prepare(self, metadata: AttentionMetadata) -> None:
        super().prepare(metadata)
        self._plans: dict[bool, PrefillPlan] = {}  # this step's, with SDPA prompts and without

    def _prefill_plan(self, metadata: AttentionMetadata, sdpa: bool) -> "PrefillPlan":
        if sdpa not in self._plans:
            self._plans[sdpa] = prefill_plan(metadata, self.sdpa_min_tokens if sdpa else None)
        return self._plans[sdpa]

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
        query,
        key_cache,
        value_cache,
        metadata: AttentionMetadata,
        scale,
        out,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
    ):
        if key_cache.dtype not in kernel_dtypes():
            args = (query, key_cache, value_cache, metadata, scale, out)
            return super().decode(*args, window, softcap, sinks, alibi_slopes)
        n = metadata.num_decode_seqs
        cache = (key_cache, value_cache, metadata.block_tables, metadata.context_lens, scale)
        options = dict(window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
        self._run(paged_attention_decode, query[:n], out[:n], *cache, **options)

    def prefill(
        self,
        query,
        key,
        value,
        key_cache,
        value_cache,
        metadata: AttentionMetadata,
        scale,
        out,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
    ) -> None:
        """The step's prompt rows in one call of the tiled kernel (kernels/prefill_attention_cpu.c;
        this step's K/V are in the cache already): against one SDPA call per sequence (AVX-512,
        SmolLM2's heads), 2.2-2.9x faster from 1,024 to 4,096 tokens, float32 or bfloat16 (with
        AMX, long bfloat16 prompts go to SDPA instead: sdpa_prompt_min_tokens). Rows past a
        prompt (drafts to verify, a recomputed output) go through the decode kernel, each a
        decode row over its causal context, as the decode steps that made them did: outputs
        stay those of plain decoding, bit for bit."""
        if key_cache.dtype not in kernel_dtypes():
            args = (query, key, value, key_cache, value_cache, metadata, scale, out)
            return super().prefill(*args, window, softcap, sinks, alibi_slopes)
        plain = window is None and softcap is None and sinks is None and alibi_slopes is None
        bfloat16 = query.dtype == key_cache.dtype == torch.bfloat16
        sdpa = self.sdpa_min_tokens is not None and plain and bfloat16
        n = metadata.num_decode_seqs  # decode rows: one each, before the prefill rows
        query, key, value, out = query[n:], key[n:], value[n:], out[n:]
        plan = self._prefill_plan(metadata, sdpa)
        options = dict(window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
        if plan.prompt is not None:
            cache = (key_cache, value_cache, *plan.prompt, scale)
            self._run(paged_attention_prefill, query, out, *cache, **options)
        for seq, start, rows, context_len in plan.sdpa:
            span = slice(start, start + rows)
            table = metadata.block_tables[seq]
            args = (key_cache, value_cache, table, context_len, scale)
            out[span] = prefill_sequence(query[span], key[span], value[span], *args)
        if plan.sampled is not None:
            rows, tables, lens = plan.sampled
            cache = (key_cache, value_cache, tables, lens, scale)
            if rows is None:  # every prefill row
                self._run(paged_attention_decode, query, out, *cache, **options)
                return
            result = torch.empty((len(rows), *out.shape[1:]), dtype=out.dtype)
            self._run(paged_attention_decode, query[rows], result, *cache, **options)
            out.index_copy_(0, rows, result)


def sdpa_prompt_min_tokens() -> int | None:
    """On a CPU with AMX, bfloat16 prompts (or chunks) of 256 tokens or more (None: none) go to
    torch's SDPA, whose tiles run on AMX, where our prefill kernel computes in float32 FMAs
    (AVX-512 with avx512_bf16 and AMX, SmolLM2's heads, per prompt: 2.1 against 4.6 ms at 384
    tokens, 5.9 against 14.0 at 1,024, 17.9 against 49.0 at 2,048; MHA heads of 64 alike).
    Below, the Python around each SDPA call costs what it saves (ShareGPT's prompts, mostly
    shorter: 883 against 899 output tokens/s sent there whole). A layer with a window, soft
    cap, sinks or ALiBi stays with our kernel: the torch path computes those by hand."""
    if has_amx_bf16() and torch.bfloat16 in onednn_matmul_dtypes():
        return SDPA_PROMPT_MIN_TOKENS
    return None


SDPA_PROMPT_MIN_TOKENS = 256


class PrefillPlan(NamedTuple):
    """How the cpu backend attends a step's prefill rows (numbered from the first)."""

    # Prompt rows, by the tiled kernel: (block tables, query starts, query lengths, context
    # lengths) of the sequences that have any.
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Rows past a prompt, by the decode kernel (as the decode steps that made them): (the rows,
    # None for all of them; each row's block table; its causal context length).
    sampled: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None
    # Prompt rows by SDPA instead (see sdpa_prompt_min_tokens): per sequence, (its index in the
    # batch, its first row, its number of prompt rows, the context they end).
    sdpa: list[tuple[int, int, int, int]]


def prefill_plan(metadata: AttentionMetadata, sdpa_min_tokens: int | None = None) -> PrefillPlan:
    first, num_seqs = metadata.num_decode_seqs, metadata.num_seqs
    prompt_lens = metadata.prompt_lens_cpu
    seqs, starts, lens, contexts = [], [], [], []
    rows, row_seqs, row_lens, sdpa = [], [], [], []
    offset = 0
    for i in range(first, num_seqs):
        query_len, context_len = metadata.query_lens_cpu[i], metadata.context_lens_cpu[i]
        start = context_len - query_len
        n = query_len if prompt_lens is None else min(query_len, max(0, prompt_lens[i] - start))
        if sdpa_min_tokens is not None and n >= sdpa_min_tokens:
            sdpa.append((i, offset, n, start + n))
        elif n:
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
    return PrefillPlan(prompt, sampled, sdpa)
