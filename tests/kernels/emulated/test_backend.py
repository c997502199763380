"""CupyAttentionBackend end to end on the CPU: its kernel launches go to the emulator (its prefill
rows to torch's SDPA unless the prefill kernel is on), and the result must match the reference
backend on a mixed batch."""

import pytest
import torch

from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels import loader
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention_grouped import grouped_module
from pagedgen.kernels.source import kernel_source
from pagedgen.layers.rotary import Rope
from tests.attention.calls import forward, forward_qkv
from tests.kernels.emulator import Emulator, emulate
from tests.kernels.paged_cases import TOLERANCES, bloom_alibi_slopes, make_metadata


@pytest.fixture
def emulated_backend(monkeypatch, attention_emulator, cache_ops_emulators) -> CupyAttentionBackend:
    emulators = {"paged_attention.cu": attention_emulator.launch, "prefill_attention.cu": emulate}
    grouped = grouped_module(torch.float32, 64, 16, 4)
    emulators["paged_attention_grouped.cu"] = Emulator(
        kernel_source(grouped.source), list(grouped.name_expressions), grouped.defines
    ).launch
    emulators |= {source: emulator.launch for source, emulator in cache_ops_emulators.items()}
    for source in ("rope_and_cache.cu", "paged_attention_mma.cu", "prefill_attention_mma.cu"):
        emulators[source] = emulate

    def launch(kernel_launch: KernelLaunch) -> None:
        emulators[kernel_launch.module.source](kernel_launch)

    monkeypatch.setattr(loader, "launch", launch)
    return CupyAttentionBackend.__new__(CupyAttentionBackend)  # __init__ insists on a GPU


@pytest.mark.parametrize(
    "prefill_kernel", [False, True, "mma"], ids=["sdpa-prefill", "prefill-kernel", "mma-prefill"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_backend_matches_reference(emulated_backend, dtype: torch.dtype, prefill_kernel) -> None:
    # decodes (one query row each) first, then prefills with and without cached context
    query_lens, context_lens = [1, 1, 1, 20, 7], [1, 17, 100, 20, 40]
    metadata = make_metadata(query_lens, context_lens, 16, 24, "cpu")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 4, 2, 64
    query = torch.randn(num_tokens, num_heads, head_size).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size).to(dtype)
    value = torch.randn_like(key)
    cache = torch.randn(2, 24, 16, num_kv_heads, head_size).to(dtype)
    ref_cache = cache.clone()
    scale = head_size**-0.5

    emulated_backend.use_prefill_kernel = bool(prefill_kernel)  # prefill_kernel
    emulated_backend.use_tensor_core_prefill = prefill_kernel == "mma"  # float32: the plain one
    emulated_backend.prepare(metadata)
    out = forward(emulated_backend, query, key, value, cache[0], cache[1], metadata, scale)
    expected = forward(
        ReferenceAttentionBackend(), query, key, value, ref_cache[0], ref_cache[1], metadata, scale
    )
    tolerance = TOLERANCES[dtype] * (1 if prefill_kernel else 10)  # SDPA's own rounding
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(cache, ref_cache)


def test_grouped_decode_matches_reference(emulated_backend, monkeypatch) -> None:
    """grouped_decode=True: decode rows go to the grouped kernel."""
    names = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: names.append(k.name_expression) or launch(k))
    query_lens, context_lens = [1, 1, 1], [1, 17, 100]
    metadata = make_metadata(query_lens, context_lens, 16, 12, "cpu")
    query, key = torch.randn(3, 4, 64), torch.randn(3, 2, 64)
    cache = torch.randn(2, 12, 16, 2, 64)
    ref_cache = cache.clone()

    emulated_backend.use_grouped_decode = True
    emulated_backend.prepare(metadata)
    out = forward(emulated_backend, query, key, key, cache[0], cache[1], metadata, 0.125)
    expected = forward(
        ReferenceAttentionBackend(), query, key, key, ref_cache[0], ref_cache[1], metadata, 0.125
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert any("grouped_v2_kernel" in name for name in names), names  # 64-token partitions


def test_tensor_core_decode_matches_reference(emulated_backend, monkeypatch) -> None:
    """tensor_core_decode=True: float16 decode rows go to the tensor-core kernel."""
    names = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: names.append(k.name_expression) or launch(k))
    query_lens, context_lens = [1, 1, 1], [1, 17, 100]
    metadata = make_metadata(query_lens, context_lens, 16, 12, "cpu")
    query, key = torch.randn(3, 8, 64).half(), torch.randn(3, 2, 64).half()
    cache = torch.randn(2, 12, 16, 2, 64).half()
    ref_cache = cache.clone()

    emulated_backend.use_tensor_core_decode = True
    emulated_backend.prepare(metadata)
    out = forward(emulated_backend, query, key, key, cache[0], cache[1], metadata, 0.125)
    expected = forward(
        ReferenceAttentionBackend(), query, key, key, ref_cache[0], ref_cache[1], metadata, 0.125
    )
    tolerance = TOLERANCES[torch.float16]
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert any("mma_v2_kernel" in name for name in names), names  # a few blocks: partitions


def test_decode_longest_first_matches_reference(emulated_backend, monkeypatch) -> None:
    """decode_longest_first=True: the one-pass tensor-core kernel (a GPU of one SM:
    no partitions) gets the step's decode rows longest first, sorted once for every layer."""
    from pagedgen.kernels import paged_attention

    launches = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: launches.append(k) or launch(k))
    monkeypatch.setattr(paged_attention, "num_sms", lambda device: 1)
    query_lens, context_lens = [1] * 5 + [9], [17, 1, 100, 64, 65, 30]
    metadata = make_metadata(query_lens, context_lens, 16, 24, "cpu")
    query, key = torch.randn(14, 8, 64).half(), torch.randn(14, 2, 64).half()
    cache = torch.randn(2, 24, 16, 2, 64).half()
    ref_cache = cache.clone()

    emulated_backend.use_tensor_core_decode = True
    emulated_backend.decode_longest_first = True
    emulated_backend.prepare(metadata)
    for _ in range(2):  # two layers of one step
        out = forward(emulated_backend, query, key, key, cache[0], cache[1], metadata, 0.125)
    expected = forward(
        ReferenceAttentionBackend(), query, key, key, ref_cache[0], ref_cache[1], metadata, 0.125
    )
    tolerance = TOLERANCES[torch.float16]
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    decodes = [k for k in launches if "mma_v1_kernel" in k.name_expression]
    assert len(decodes) == 2 and decodes[0].args[-1] is decodes[1].args[-1]
    assert decodes[0].args[-1].tolist() == [2, 4, 3, 0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_qkv_ropes_and_caches_in_one_launch(emulated_backend, dtype) -> None:
    """From a fused projection: the rope_and_cache launch, then the same attention as the
    torch path's RoPE, cache write and attention."""
    query_lens, context_lens = [1, 1, 9, 5], [4, 30, 9, 21]
    metadata = make_metadata(query_lens, context_lens, 16, 12, "cpu")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 4, 2, 64
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size).to(dtype)
    angles = torch.rand(num_tokens, 1, head_size // 2) * 6.3
    rope = Rope(angles.cos(), angles.sin())
    cache = torch.randn(2, 12, 16, num_kv_heads, head_size).to(dtype)
    ref_cache = cache.clone()
    args = (num_heads, num_kv_heads, rope)

    emulated_backend.use_prefill_kernel = True
    emulated_backend.prepare(metadata)
    out = forward_qkv(emulated_backend, qkv.clone(), *args, *cache, metadata, head_size**-0.5)
    expected = forward_qkv(
        ReferenceAttentionBackend(), qkv.clone(), *args, *ref_cache, metadata, head_size**-0.5
    )
    assert torch.equal(cache, ref_cache)
    torch.testing.assert_close(out, expected, atol=TOLERANCES[dtype], rtol=TOLERANCES[dtype])


@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["sdpa-prefill", "prefill-kernel"])
def test_alibi_layer_matches_reference(emulated_backend, monkeypatch, prefill_kernel) -> None:
    """BLOOM's layers: a fused projection without RoPE (the torch path splits it), ALiBi slopes
    to the decode kernel and the prefill kernel or the torch fallback; the grouped kernel, asked
    for, declines them."""
    names = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: names.append(k.name_expression) or launch(k))
    query_lens, context_lens = [1, 1, 1, 20, 7], [1, 17, 100, 20, 40]
    metadata = make_metadata(query_lens, context_lens, 16, 24, "cpu")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 4, 2, 64
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size)
    cache = torch.randn(2, 24, 16, num_kv_heads, head_size)
    ref_cache = cache.clone()
    args = (num_heads, num_kv_heads, None)
    options = (head_size**-0.5, None, None, None, bloom_alibi_slopes(num_heads))

    emulated_backend.use_prefill_kernel = prefill_kernel
    emulated_backend.use_grouped_decode = True
    emulated_backend.prepare(metadata)
    out = forward_qkv(emulated_backend, qkv.clone(), *args, *cache, metadata, *options)
    expected = forward_qkv(
        ReferenceAttentionBackend(), qkv.clone(), *args, *ref_cache, metadata, *options
    )
    assert torch.equal(cache, ref_cache)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert any("paged_attention_v1" in name for name in names), names
    assert any("prefill_attention" in name for name in names) == prefill_kernel, names
    assert not any("grouped" in name for name in names), names


@pytest.mark.parametrize(
    ("dtype", "num_heads", "decode"),
    [
        (torch.float16, 8, "mma"),  # GQA 4:1
        (torch.bfloat16, 6, "mma"),  # 3:1, SmolLM2's
        (torch.float16, 4, "paged_attention_v"),  # 2:1: the per-head kernel
        (torch.float32, 8, "paged_attention_v"),  # no tensor-core kernel for float32
    ],
)
def test_unless_told_16_bit_layers_attend_on_tensor_cores(
    emulated_backend, monkeypatch, dtype, num_heads, decode
) -> None:
    """No variable set: decode rows of 16-bit GQA layers with groups of 3 or more, and every
    16-bit layer's prefill rows, go to the tensor-core kernels, and match the reference."""
    names = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: names.append(k.name_expression) or launch(k))
    query_lens, context_lens = [1, 1, 12], [17, 40, 20]
    metadata = make_metadata(query_lens, context_lens, 16, 12, "cpu")
    num_tokens, num_kv_heads, head_size = sum(query_lens), 2, 64
    query = torch.randn(num_tokens, num_heads, head_size).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size).to(dtype)
    cache = torch.randn(2, 12, 16, num_kv_heads, head_size).to(dtype)
    ref_cache = cache.clone()

    emulated_backend.prepare(metadata)
    out = forward(emulated_backend, query, key, key, cache[0], cache[1], metadata, 0.125)
    expected = forward(
        ReferenceAttentionBackend(), query, key, key, ref_cache[0], ref_cache[1], metadata, 0.125
    )
    torch.testing.assert_close(out, expected, atol=TOLERANCES[dtype], rtol=TOLERANCES[dtype])
    decode_name, prefill_name = names[-2:]  # after the cache write
    assert decode in decode_name and "prefill" not in decode_name, names
    assert ("prefill_attention_mma" in prefill_name) == (dtype != torch.float32), names


def test_an_asked_for_grouped_kernel_wins_over_tensor_cores_unless_told() -> None:
    """grouped_decode=True alone (grouped=True, tensor_cores=None) keeps the grouped
    kernel where the tensor-core one would be picked; tensor_cores=True takes it anyway."""
    from pagedgen.kernels.paged_attention import paged_attention_launches

    out, query = torch.empty(2, 8, 128).half(), torch.randn(2, 8, 128).half()
    cache = torch.randn(2, 8, 16, 2, 128).half()
    tables = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    context_lens = torch.tensor([17, 40], dtype=torch.int32)
    args = (out, query, cache[0], cache[1], tables, context_lens, 40, 0.1)

    def kernel(**flags) -> str:
        return paged_attention_launches(*args, **flags)[0].name_expression

    assert "mma" in kernel(tensor_cores=None)
    assert "grouped" in kernel(grouped=True, tensor_cores=None)
    assert "mma" in kernel(grouped=True, tensor_cores=True)
    assert "mma" not in kernel(grouped=None, tensor_cores=False)


def test_backend_rejects_unsupported_sizes_when_built(monkeypatch) -> None:
    monkeypatch.setattr(loader, "cupy_available", lambda: True)
    with pytest.raises(ValueError, match="block sizes"):
        CupyAttentionBackend(torch.device("cuda"), 64, 64)
    with pytest.raises(ValueError, match="head sizes"):
        CupyAttentionBackend(torch.device("cuda"), 72, 16)


@pytest.mark.parametrize("decode", ["per-head", "grouped", "mma"])
def test_each_layer_of_a_step_attends_its_own_tensors(emulated_backend, monkeypatch, decode):
    """Three layers of one step through one plan (step_plans.py): each reads its own query rows
    and caches and writes its own output, the v2 decode's shared scratch and the prefill kernel
    included; a fourth layer with another scale is planned anew."""
    plans = []
    planner = emulated_backend.step_plans
    launches = type(planner).launches

    def counted(self, metadata, kind, tensors, scalars, plan):
        return launches(
            self, metadata, kind, tensors, scalars, lambda: plans.append(kind) or plan()
        )

    monkeypatch.setattr(type(planner), "launches", counted)
    dtype = torch.float16 if decode == "mma" else torch.float32
    emulated_backend.use_prefill_kernel = True
    emulated_backend.use_grouped_decode = decode == "grouped"
    emulated_backend.use_tensor_core_decode = decode == "mma"
    query_lens, context_lens = [1, 1, 9, 5], [600, 17, 9, 21]  # 600 tokens: v2 partitions
    metadata = make_metadata(query_lens, context_lens, 16, 48, "cpu")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 4, 1, 64
    emulated_backend.prepare(metadata)
    for scale in (0.125, 0.125, 0.125, 0.25):
        query = torch.randn(num_tokens, num_heads, head_size).to(dtype)
        key = torch.randn(num_tokens, num_kv_heads, head_size).to(dtype)
        cache = torch.randn(2, 48, 16, num_kv_heads, head_size).to(dtype)
        ref_cache = cache.clone()
        out = forward(emulated_backend, query, key, key, cache[0], cache[1], metadata, scale)
        expected = forward(
            ReferenceAttentionBackend(),
            query,
            key,
            key,
            ref_cache[0],
            ref_cache[1],
            metadata,
            scale,
        )
        tolerance = TOLERANCES[dtype]
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert plans == ["decode", "prefill", "decode", "prefill"], plans
