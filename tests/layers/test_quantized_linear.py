"""Linear layers over quantized weights: QuantizedWeight shards (of different formats in one fused
layer) computed by cpu_gemm_quant with no dense weight left; dequantized where that kernel does not
run; online int8 / int4 quantization of a float checkpoint, checked on a tiny random Llama against
the float model, with greedy results that do not depend on the batch."""

import pytest
import torch

from pagedgen import LLM, SamplingParams
from pagedgen.entrypoints.bench.roofline import model_costs
from pagedgen.kernels import cpu_features, cpu_gemm_quant, cpu_gemm_quant_bf16
from pagedgen.layers.linear import QUANTIZED, Linear, describe_weights
from pagedgen.layers.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from tests.kernels.cpu.test_gemm_quant import random_weight

SIZES = [32, 16, 16]  # q, k, v of a small fused QKV


def qkv_shards() -> list[QuantizedWeight]:
    """As a GGUF Q4_K_M file stores them: q and k in Q4_K's format, v in Q6_K's."""
    return [
        random_weight(32, 64, 4, 32, True, seed=1),
        random_weight(16, 64, 4, 32, True, seed=2),
        random_weight(16, 64, 8, 16, False, seed=3),
    ]


def load(layer: Linear, shards: list, bias: torch.Tensor | None = None) -> Linear:
    for i, shard in enumerate(shards):
        layer.load_shard("weight", shard, i)
        if bias is not None:
            start = sum(SIZES[:i])
            layer.load_shard("bias", bias[start : start + SIZES[i]], i)
    return layer


@pytest.fixture
def no_quant_kernel(monkeypatch):
    monkeypatch.setenv("PAGEDGEN_DISABLE_CPU_GEMM", "1")
    cpu_gemm_quant.enabled.cache_clear()
    yield
    monkeypatch.undo()
    cpu_gemm_quant.enabled.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shards_of_different_formats_are_each_computed_at_their_size(dtype):
    """(In bfloat16 the 4-bit segment runs on cpu_gemm_quant_bf16 where it runs here, bfloat16
    tiles or dot products, the rest on the integers; by default a bfloat16 layer keeps its
    integers only where the tiles take all of them, so "int4" is asked for here.)"""
    shards = qkv_shards()
    bias = torch.randn(64).to(dtype)
    layer = load(Linear(64, SIZES, bias=True).to(dtype), shards, bias)
    assert layer.pack(quantization="int4") and layer.layout == QUANTIZED
    assert layer.weight.numel() == 0  # no dense copy
    tiles = dtype == torch.bfloat16 and cpu_gemm_quant_bf16.takes(4, 32, 64)
    int4 = "int4 g32 +mins" + (f" on {cpu_gemm_quant_bf16.path_name()}" if tiles else "")
    assert layer.quant.formats == [int4, "int8 g16"]  # q and k: one segment
    packed_bytes = sum(p.numel() for p in layer.quant.packed)
    assert packed_bytes < 64 * 64  # under a byte a weight
    x = torch.randn(5, 64).to(dtype)
    y = layer(x)
    start = 0
    for shard in shards:
        cols = slice(start, start + shard.shape[0])
        if tiles and shard.bits == 4:
            packed = cpu_gemm_quant_bf16.pack(shard.qweight, shard.scales, shard.mins, 4, 32)
            alone = cpu_gemm_quant_bf16.linear(x, packed, bias[cols], shard.shape[0], 4, 32, True)
        else:
            packed = cpu_gemm_quant.pack(
                shard.qweight, shard.scales, shard.mins, shard.bits, shard.group_size
            )
            alone = cpu_gemm_quant.linear(
                x, packed, bias[cols], *(shard.shape[0], shard.bits, shard.group_size),
                shard.mins is not None,
            )  # fmt: skip
        assert torch.equal(y[:, cols], alone)
        start += shard.shape[0]
    dense = torch.cat([s.dequantize() for s in shards])
    ref = x.float() @ dense.T + bias.float()
    assert torch.allclose(y.float(), ref, rtol=0.02, atol=0.02 * ref.abs().max().item())
    assert "int4 g32 +mins" in describe_weights(layer) and "GiB" in describe_weights(layer)


@pytest.mark.skipif(
    cpu_gemm_quant_bf16.error() is not None or not cpu_gemm_quant_bf16.on_tiles(),
    reason="no bfloat16 tiles here",
)
def test_a_bfloat16_layer_keeps_4_bit_weights_on_bfloat16_tiles_with_the_dense_bits():
    """By default: the dense bfloat16 layer's outputs, to the bit, from the integers; a layer with
    a shard the tiles do not take (8 bits) is dequantized whole instead."""
    shards = qkv_shards()[:2]  # q and k: 4 bits in groups of 32
    bias = torch.randn(64).bfloat16()
    layer = load(Linear(64, [32, 16], bias=True).bfloat16(), shards, bias)
    assert layer.pack() and layer.layout == QUANTIZED
    assert layer.quant.formats == ["int4 g32 +mins on bfloat16 tiles"]
    assert describe_weights(layer).startswith("weights int4 g32 +mins (on bfloat16 tiles) and")
    dense = Linear(64, [32, 16], bias=True).bfloat16()
    dense.weight.data.copy_(torch.cat([s.dequantize() for s in shards]))
    dense.bias.data.copy_(bias[:48])
    dense.pack()
    for rows in (1, 17, 64, 65):
        x = torch.randn(rows, 64).bfloat16()
        assert torch.equal(layer(x), dense(x)), rows
    mixed = load(Linear(64, SIZES).bfloat16(), qkv_shards())
    mixed.pack()
    assert mixed.layout != QUANTIZED and mixed.weight.dtype == torch.int16  # bfloat16 panels


@pytest.mark.skipif(
    cpu_gemm_quant_bf16.error() is not None or cpu_gemm_quant_bf16.on_tiles(),
    reason="no AVX512_BF16 dot products without tiles here",
)
def test_on_bfloat16_dot_products_a_layer_keeps_its_integers_where_asked_with_the_dense_bits():
    """Without AMX the dense path's bits come from dot products over panels dequantized as they
    are read: a checkpoint's own integers stay by default only where tiles take them (the dense
    layer is faster at decode batches), and with "int4" asked for they give the dense bits."""
    shards = qkv_shards()[:2]  # q and k: 4 bits in groups of 32
    bias = torch.randn(64).bfloat16()
    default = load(Linear(64, [32, 16], bias=True).bfloat16(), shards, bias)
    default.pack()
    assert default.layout != QUANTIZED and default.weight.dtype == torch.int16
    layer = load(Linear(64, [32, 16], bias=True).bfloat16(), shards, bias)
    assert layer.pack(quantization="int4") and layer.layout == QUANTIZED
    assert layer.quant.formats == ["int4 g32 +mins on bfloat16 dot products"]
    assert describe_weights(layer).startswith("weights int4 g32 +mins (on bfloat16 dot products)")
    for rows in (1, 13, 64, 600):
        x = torch.randn(rows, 64).bfloat16()
        assert torch.equal(layer(x), default(x)), rows


def assert_computes_in_float(layer: Linear, dense: torch.Tensor) -> None:
    assert layer.layout != QUANTIZED
    x = torch.randn(3, dense.shape[1])
    assert torch.allclose(layer(x), x @ dense.T, rtol=1e-5, atol=1e-5)


@pytest.fixture
def avx2_cap(monkeypatch):
    """PAGEDGEN_MAX_CPU_ISA=avx2 for one test: the AVX2 build, no AMX."""

    def clear() -> None:
        for cached in (cpu_features.max_cpu_isa, cpu_gemm_quant.enabled, cpu_gemm_quant.amx_error):
            cached.cache_clear()

    monkeypatch.setenv("PAGEDGEN_MAX_CPU_ISA", "avx2")
    clear()
    yield
    monkeypatch.undo()
    clear()


def test_a_layer_gives_the_same_bits_on_every_isa(request):
    """AVX-512 VNNI below 16 rows and AMX-INT8 from 16 where the machine has them, then AVX2."""
    x = torch.randn(40, 64).bfloat16()
    layer = load(Linear(64, SIZES), qkv_shards())
    layer.pack()
    native = [layer(x[:rows]) for rows in (1, 15, 16, 40)]
    request.getfixturevalue("avx2_cap")
    assert cpu_gemm_quant.path_name() == "AVX2"
    capped = load(Linear(64, SIZES), qkv_shards())
    capped.pack()
    for rows, y in zip((1, 15, 16, 40), native):
        assert torch.equal(capped(x[:rows]), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_online_int8_computes_w8a8_without_amx_the_same_bits_on_every_isa(dtype, request):
    """Online int8 weights compute against x quantized to int8 (one digit) where AMX-INT8 is
    not, in either dtype: the integer kernel's one-digit scheme, the same bits on AVX2; with AMX
    tiles, as other int8 weights."""
    torch.manual_seed(2)
    weight = torch.randn(48, 256) * 0.05
    x = torch.randn(40, 256).to(dtype)
    layer = Linear(256, [48], bias=False).to(dtype)
    layer.load_shard("weight", weight.to(dtype), None)
    assert layer.pack(quantization="int8") and layer.layout == QUANTIZED
    if not cpu_gemm_quant.int8_activations_faster():
        assert layer.quant.segments[0].digits == 2
        return
    assert layer.quant.formats == ["int8 per row x int8"]
    q = quantize_int8(weight.to(dtype))
    packed = cpu_gemm_quant.pack(q.qweight, q.scales, None, 8, 256, half=True)
    native = [layer(x[:rows]) for rows in (1, 15, 16, 40)]
    for rows, y in zip((1, 15, 16, 40), native):
        assert torch.equal(
            y, cpu_gemm_quant.linear(x[:rows], packed, None, 48, 8, 256, False, True, digits=1)
        )
    request.getfixturevalue("avx2_cap")
    capped = Linear(256, [48], bias=False).to(dtype)
    capped.load_shard("weight", weight.to(dtype), None)
    assert capped.pack(quantization="int8")
    for rows, y in zip((1, 15, 16, 40), native):
        assert torch.equal(capped(x[:rows]), y)


def test_where_the_kernel_does_not_run_the_shards_are_dequantized(no_quant_kernel):
    shards = qkv_shards()
    layer = load(Linear(64, SIZES), shards)
    layer.pack()
    assert_computes_in_float(layer, torch.cat([s.dequantize() for s in shards]))


def test_none_and_mixed_float_shards_compute_in_float():
    shards = qkv_shards()
    layer = load(Linear(64, SIZES), shards)
    layer.pack(quantization="none")
    assert_computes_in_float(layer, torch.cat([s.dequantize() for s in shards]))
    mixed = Linear(64, SIZES)
    mixed.load_shard("weight", shards[0], 0)
    mixed.load_shard("weight", shards[1], 1)
    mixed.load_shard("weight", torch.ones(16, 64), 2)
    mixed.pack()
    dense = torch.cat([shards[0].dequantize(), shards[1].dequantize(), torch.ones(16, 64)])
    assert_computes_in_float(mixed, dense)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_online_quantization_of_a_float_layer(quantization):
    torch.manual_seed(0)
    layer = Linear(256, [96, 64], bias=False)
    weight = torch.randn(160, 256) * 0.05
    layer.load_shard("weight", weight, None)
    assert layer.pack(quantization=quantization) and layer.layout == QUANTIZED
    groups = "per row" if quantization == "int8" else "g128 +mins"
    if quantization == "int8" and cpu_gemm_quant.int8_activations_faster():
        groups += " x int8"  # W8A8
    assert layer.quant.formats == [f"{quantization} {groups}"]
    x = torch.randn(4, 256)
    error = (layer(x) - x @ weight.T).norm() / (x @ weight.T).norm()
    assert error < (0.015 if quantization == "int8" else 0.13), error  # int4: ~0.1 rms a step


def float16_near(x: torch.Tensor, subnormal_ok: bool) -> torch.Tensor:
    """x's nearest float16 values where finite and (unless subnormal_ok) zero or normal."""
    h = x.half().float()
    keep = h.isfinite() & (subnormal_ok | (h == 0) | (h.abs() >= 2**-14))
    return torch.where(keep, h, x)


def torch_quantize(weight: torch.Tensor, bits: int, group_size: int):
    """The one-pass C quantizer's twin: (qweight values, scales, mins)."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    if bits == 8:
        scale = float16_near(w.abs().amax(dim=-1) / 127, False)
        inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        q = (w * inverse[..., None]).round().clamp(-127, 127)
        return q.reshape(n, k), scale, None
    low, high = float16_near(w.amin(dim=-1), True), w.amax(dim=-1)
    scale = float16_near((high - low) / 15, False)
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = ((w - low[..., None]) * inverse[..., None]).round().clamp(0, 15)
    return q.reshape(n, k), scale, low


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantizers_match_their_torch_twin_and_round_trip_within_half_a_step(dtype):
    torch.manual_seed(1)
    weight = torch.randn(40, 256).to(dtype)
    weight[3] = 0  # a zero row: scale 0, q 0
    weight[4, :128] = 0.5  # a constant group
    q8 = quantize_int8(weight)
    values, scales, _ = torch_quantize(weight, 8, 256)
    assert q8.group_size == 256 and q8.mins is None
    assert torch.equal(q8.values(), values.short()) and torch.equal(q8.scales, scales)
    step = q8.scales
    assert ((q8.dequantize() - weight.float()).abs() <= step / 2 + 127 * step * 2**-11).all()
    q4 = quantize_int4(weight)
    values, scales, mins = torch_quantize(weight, 4, 128)
    assert q4.group_size == 128 and torch.equal(q4.mins, mins)
    assert torch.equal(q4.values(), values.short()) and torch.equal(q4.scales, scales)
    step = q4.scales.repeat_interleave(128, dim=1)
    # (+ the parameters' float16 rounding: half an ulp of the minimum and of 15 steps)
    slack = (q4.mins.abs().repeat_interleave(128, dim=1) + 15 * step) * 2**-11 + 1e-6
    assert ((q4.dequantize() - weight.float()).abs() <= step / 2 + slack).all()
    assert cpu_gemm_quant.float16_params(q4.scales, q4.mins)
    assert cpu_gemm_quant.float16_params(q8.scales, None)
    assert quantize_int4(torch.randn(4, 96)).group_size == 32


PROMPTS = [[5, 9, 200, 31, 7, 7, 100], list(range(40, 70)), [100, 3], [7] * 13]


def run_llm(path, quantization, prompts, max_tokens=6, dtype="auto"):
    # No prefix caching: a hit computes the rest of a prompt as a shorter prefill, whose float
    # sums differ (a float model's too), where this checks the batch alone.
    llm = LLM(
        str(path), quantization=quantization, kv_cache_memory=0.01, block_size=4,
        enable_prefix_caching=False, log=lambda m: None, dtype=dtype,
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    prompt_params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate(prompts, params)
    scored = llm.generate(prompts, prompt_params)
    return llm, outputs, scored


@pytest.mark.parametrize(
    "quantization,dtype", [("int8", "float32"), ("int4", "float32"), ("int8", "bfloat16")]
)
def test_online_quantized_llama_is_close_to_float_and_batch_independent(
    tiny_llama_path, quantization, dtype
):
    """int8 computes W8A8 where AMX-INT8 is not, in either dtype."""
    float_llm, _, float_scored = run_llm(tiny_llama_path, None, PROMPTS, dtype=dtype)
    llm, outputs, scored = run_llm(tiny_llama_path, quantization, PROMPTS, dtype=dtype)
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.layout == QUANTIZED for m in linears)
    flops, weight_bytes = model_costs(model)  # what `pagedgen profile` counts
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert flops == 2 * sum(m.in_features * m.out_features for m in linears) + 2 * sum(
        p.numel() for p in norms
    )
    packed = sum(p.numel() for m in linears for p in m.quant.packed)
    assert weight_bytes == packed + sum(p.numel() * p.element_size() for p in norms)
    float_bytes = model_costs(float_llm.engine.runner.model)[1]
    assert weight_bytes < float_bytes / (2.5 if dtype == "float32" else 1.7)
    # A random model's logits are large (median |logprob| ~8.5): the errors are relative, ~1 %
    # (int8) and ~8 % (int4) of a prompt token's logprob on average.
    tolerance = 0.025 if quantization == "int8" else 0.15
    errors, sizes = [], []
    for quantized, reference in zip(scored, float_scored):
        for got, want in zip(quantized.prompt_logprobs[1:], reference.prompt_logprobs[1:]):
            assert list(got) == list(want)  # the prompt's token
            errors.append(abs(next(iter(got.values())).logprob - next(iter(want.values())).logprob))
            sizes.append(abs(next(iter(want.values())).logprob))
    assert sum(errors) < tolerance * sum(sizes), (sum(errors) / sum(sizes), max(errors))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    for i, prompt in enumerate(PROMPTS):  # alone, then in the batch: the same bits
        alone = llm.generate([prompt], params)[0].outputs[0]
        assert alone.token_ids == outputs[i].outputs[0].token_ids
        assert alone.logprobs == outputs[i].outputs[0].logprobs
