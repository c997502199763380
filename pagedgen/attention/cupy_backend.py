import torch

from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.spec import AttentionSpec, spec_options
from pagedgen.attention.step_plans import StepPlans
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.config import CudaAttentionConfig
from pagedgen.kernels import loader, paged_attention_mma
from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.cache_ops import copy_blocks, reshape_and_cache, swap_blocks
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.layer_ops import rope_and_cache
from pagedgen.kernels.paged_attention import paged_attention_launches
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from pagedgen.layers.rotary import Rope


def cupy_available() -> bool:
    """CuPy imports and sees a GPU, so `auto` may pick this backend on CUDA devices."""
    return loader.cupy_available()


class CupyAttentionBackend(TorchAttentionBackend):
    """Our CUDA kernels through CuPy: rope_and_cache applies RoPE and writes K/V in one launch,
    paged attention v1/v2 serves decode rows, and one prefill attention launch per layer serves
    every prefill and chunked-prefill row, cached prefixes included
    (kernels/prefill_attention.cu, or its tensor-core twin below), or, with
    CudaAttentionConfig.prefill_kernel false, PyTorch's SDPA, one call per sequence. GQA layers
    with groups of 4 or more and heads of 128 or more decode with the grouped kernel, which
    reads each kv head's K/V once for its group (grouped_decode true for every GQA layer, false
    for none); per-head decode warps prefetch their next KV block into L2, grouped ones do not
    (l2_prefetch true for both, false for neither). Layers with a 16-bit cache of the model's
    dtype and heads of 64, 128 or 256 (every option below included; sm_80 or newer) run their
    prefill rows, and their decode rows where GQA groups hold 3 or more query heads, on tensor
    cores (kernels/prefill_attention_mma.cu, paged_attention_mma.cu); tensor_core_decode and
    tensor_core_prefill true take them for every such layer, false for none (the kernels above).
    Reads the same cache layout as the torch backend. Supports the head sizes HEAD_SIZES and
    block sizes BLOCK_SIZES, and fp8 caches (kv_cache_dtype fp8, fp8_e4m3, fp8_e5m2) beside
    caches of the model's dtype: every kernel rounds K/V into them as to_cache_dtype does, and
    attention reads this step's K/V back from the cache, so it sees them as later steps will.
    Sliding windows (Mistral, Gemma 2/3, gpt-oss), soft-capped scores (Gemma 2), attention sinks
    (gpt-oss) and ALiBi slopes (BLOOM, MPT) are read by every attention kernel but the grouped
    one, which declines such layers."""

    name = "cupy"
    # CudaAttentionConfig's defaults; __init__ sets each from the engine's options (tests set
    # them on a backend built without __init__, emulated on the CPU).
    use_prefill_kernel: bool = True
    use_grouped_decode: bool | None = None
    use_l2_prefetch: bool | None = None
    use_tensor_core_decode: bool | None = None
    use_tensor_core_prefill: bool | None = None
    decode_longest_first: bool = False

    def __init__(
        self,
        device: torch.device,
        head_size: int,
        block_size: int,
        options: CudaAttentionConfig = CudaAttentionConfig(),
    ) -> None:
        if device.type != "cuda":
            raise RuntimeError(
                f"the cupy attention backend runs on CUDA devices only, got {device}; "
                "use --attention-backend torch"
            )
        if not cupy_available():
            raise RuntimeError(
                "the cupy attention backend needs CuPy and a visible GPU: install it with "
                "`pip install 'pagedgen[cuda]'` (cupy-cuda12x) or use --attention-backend torch"
            )
        if not self.supports(head_size, block_size):
            raise ValueError(
                f"the cupy backend supports block sizes {BLOCK_SIZES} and head sizes "
                f"{HEAD_SIZES}, got block_size={block_size}, head_size={head_size}; "
                "use --attention-backend torch"
            )
        super().__init__()
        self.device = device
        self.use_prefill_kernel = options.prefill_kernel
        self.use_grouped_decode = options.grouped_decode
        self.use_l2_prefetch = options.l2_prefetch
        self.use_tensor_core_decode = options.tensor_core_decode
        self.use_tensor_core_prefill = options.tensor_core_prefill
        self.decode_longest_first = options.decode_longest_first
        if self.use_tensor_core_decode is not False:  # its counters, before any graph capture
            paged_attention_mma.counters(device, 1)

    @property
    def step_plans(self) -> StepPlans:
        """The step's decode and prefill launches, planned by its first layer (step_plans.py);
        made on first use, so that a backend built without __init__ (emulated on the CPU) has
        them too."""
        plans = self.__dict__.get("_step_plans")
        if plans is None:
            plans = self.__dict__["_step_plans"] = StepPlans()
        return plans

    @staticmethod
    def supports(head_size: int, block_size: int) -> bool:
        return head_size in HEAD_SIZES and block_size in BLOCK_SIZES

    def forward_qkv(
        self,
        spec: AttentionSpec,
        qkv: torch.Tensor,
        rope: Rope | None,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """RoPE and the cache write in one launch (kernels/rope_and_cache.cu), then attention;
        partial rotary or none by torch's ops and a reshape_and_cache launch."""
        if rope is None or rope.rotary_dim != key_cache.shape[-1]:
            return super().forward_qkv(spec, qkv, rope, key_cache, value_cache, metadata)
        cos, sin = rope.cos.flatten(1), rope.sin.flatten(1)  # [num_tokens, head_size // 2]
        query, key, value = rope_and_cache(
            qkv,
            spec.num_heads,
            spec.num_kv_heads,
            cos,
            sin,
            key_cache,
            value_cache,
            metadata.slot_mapping,
        )
        return self.attend(spec, query, key, value, key_cache, value_cache, metadata)

    def write_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)

    def decode(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        num_decode = metadata.num_decode_seqs
        views = self.step_plans.step_views(metadata)
        out, query = out[:num_decode], query[:num_decode]
        flags = (self.use_grouped_decode, self.use_l2_prefetch, self.use_tensor_core_decode)
        tensors = (out, query, key_cache, value_cache, spec.sinks, spec.alibi_slopes)
        plans = self.step_plans
        seq_order = plans.longest_first(metadata) if self.decode_longest_first else None

        def plan() -> list[KernelLaunch]:
            return paged_attention_launches(
                out,
                query,
                key_cache,
                value_cache,
                views.decode_block_tables,
                views.decode_context_lens,
                views.max_decode_context_len,
                spec.scale,
                grouped=flags[0],
                l2_prefetch=flags[1],
                tensor_cores=flags[2],
                **spec_options(spec),
                seq_order=seq_order,
            )

        self._launch(plans.launches(metadata, "decode", tensors, (spec, *flags), plan))

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
        if not self.use_prefill_kernel:
            super().prefill(spec, query, key, value, key_cache, value_cache, metadata, out)
            return
        views = self.step_plans.step_views(metadata)
        tensor_cores = self.use_tensor_core_prefill
        tensors = (out, query, key_cache, value_cache, spec.sinks, spec.alibi_slopes)

        def plan() -> list[KernelLaunch]:
            launch = prefill_attention_launch(
                out,
                query,
                key_cache,
                value_cache,
                views.prefill_block_tables,
                views.prefill_cu_seqlens_q,
                views.prefill_context_lens,
                views.max_prefill_query_len,
                spec.scale,
                spec.sliding_window,
                spec.logits_soft_cap,
                spec.sinks,
                spec.alibi_slopes,
                tensor_cores=tensor_cores,
            )
            return [] if launch is None else [launch]

        scalars = (spec, tensor_cores)
        self._launch(self.step_plans.launches(metadata, "prefill", tensors, scalars, plan))

    @staticmethod
    def _launch(launches: list[KernelLaunch]) -> None:
        for kernel_launch in launches:
            loader.launch(kernel_launch)

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: list[tuple[int, int]]) -> None:
        copy_blocks(kv_caches, src_to_dst)

    def swap_blocks(
        self, src: list[torch.Tensor], dst: list[torch.Tensor], src_to_dst: list[tuple[int, int]]
    ) -> None:
        """Copies blocks between per-layer [2, num_blocks, ...] caches, GPU <-> pinned host."""
        for src_cache, dst_cache in zip(src, dst, strict=True):
            swap_blocks(src_cache[0], dst_cache[0], src_to_dst)
            swap_blocks(src_cache[1], dst_cache[1], src_to_dst)
