from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.kernels import cpu_gemm, cpu_gemm_bf16, cpu_gemm_quant
from pagedgen.kernels.cpu_features import cpu_compute_dtype, has_avx512, onednn_matmul_dtypes
from pagedgen.layers.quantized_linear import (
    ONLINE_QUANTIZERS,
    QuantizedPanels,
    bf16_suffix,
    bf16_tiles_take,
    dequantize_into,
    kernel_takes,
    quantize_online,
)
from pagedgen.layers.quantized_weight import QuantizedWeight

# oneDNN's blocked weight layout is chosen for this many rows; any number of rows works.
PACK_BATCH_SIZE = 64


# Linear.layout: how the weight is held, and so which kernel runs.
DENSE = "dense"  # nn.Linear's [out, in]: F.linear (GPUs, and before pack())
PANELS = "panels"  # cpu_gemm's 16-column panels (float32 compute on AVX2/AVX-512 CPUs)
PAIR_PANELS = "pair_panels"  # cpu_gemm_bf16's panels of k pairs (bfloat16: AVX512_BF16, AMX)
PAIR_PANELS_F32 = "pair_panels_f32"  # the same for float32 activations, on AMX (bfloat16 values)
ONEDNN = "onednn"  # oneDNN's blocked layout (opaque)
TRANSPOSED = "transposed"  # [in, out]: x @ W
QUANTIZED = "quantized"  # cpu_gemm_quant's panels of 4- or 8-bit integers (QuantizedPanels)


def gemm_rows(num_rows: int) -> int:
    """The row count a GPU GEMM of num_rows runs at: cuBLAS chooses a kernel for every new shape,
    which cost the host ~0.5 ms a call on an H100 (SmolLM2's MLP, torch 2.11, CUDA 13) against
    ~25 us for a shape seen before, and eager steps bring a new token count almost every step.
    Multiples of 32 up to 1,024 rows, of 128 past that: 56 shapes to 4,096, and past 256 rows
    at most 12.5 % more rows."""
    step = 32 if num_rows <= 1024 else 128
    return -(-num_rows // step) * step


def dense_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padded: bool | None = None
) -> torch.Tensor:
    """F.linear; with padded (by default: on a GPU, outside CUDA graph capture, where shapes are
    fixed), over x's rows zero-padded to gemm_rows. Rows are independent: the padding changes
    no real row's inputs."""
    num_rows = x.shape[0]
    if padded is None:
        padded = x.is_cuda and x.dim() == 2 and not torch.cuda.is_current_stream_capturing()
    num_padded = gemm_rows(num_rows) if padded else num_rows
    if num_padded == num_rows:
        return F.linear(x, weight, bias)
    return F.linear(F.pad(x, (0, 0, 0, num_padded - num_rows)), weight, bias)[:num_rows]


class Linear(nn.Module):
    """y = x @ weight.T (+ bias), loaded in nn.Linear's layout [out_features, in_features], as
    checkpoints store it (loading copies rows, no transposes).

    On the CPU, pack() then readies the weight for the fastest kernel at hand: in float32, our
    panel kernel (kernels/cpu_gemm.c: oneDNN's results, bit for bit, 1.05-1.3x faster), or on
    AMX, where every value of the weight is a bfloat16 one (a bfloat16 checkpoint), the AMX
    kernel's float32 matmul over bfloat16 panels (1.6-2.3x the panel kernel's speed); in
    bfloat16 with AVX512_BF16, our dot-product kernel (kernels/cpu_gemm_bf16.c, 1.15-1.3x
    oneDNN's at decode batches), or on AMX our tile kernel over the same panels
    (kernels/cpu_gemm_amx.c); else oneDNN's blocked layout, whose kernels run 2-3x faster
    than MKL's on these machines; where oneDNN has no kernel for the dtype, a dense transposed copy
    [in_features, out_features], as x @ W is several times faster than x @ W.T below ~64 rows.
    Every packed layout gives row results that do not depend on the batch. (A half-precision
    model whose dtype oneDNN lacks computes in float32 instead: see
    cpu_features.cpu_compute_dtype.)
    output_sizes splits the output rows into shards so that fused projections (QKV, gate/up)
    can load each checkpoint tensor into its own row range.

    A shard may load as a QuantizedWeight (a GGUF, GPTQ or AWQ tensor), and pack() may quantize a
    float weight (EngineConfig.quantization int8 / int4): on the CPU the layer then computes on the
    integers at their stored size (QuantizedPanels, kernels/cpu_gemm_quant.c) and holds no dense
    weight; on a GPU, or where that kernel does not run, pack() dequantizes into the dense weight.
    """

    def __init__(self, in_features: int, output_sizes: list[int] | int, bias: bool = False) -> None:
        super().__init__()
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        self.in_features, self.out_features = in_features, sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        )
        self.layout = DENSE
        # QuantizedWeight shards by their first output row, until pack() packs them.
        self.quantized_shards: dict[int, QuantizedWeight] = {}
        self.quant: QuantizedPanels | None = None  # layout QUANTIZED
        # LoRA adapters' sum added to the output (pagedgen/layers/lora.py), set on engines
        # that enable LoRA.
        self.lora: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def packed(self) -> bool:
        """Whether the weight is in a matmul kernel's own layout (panels or oneDNN's)."""
        return self.layout in (PANELS, PAIR_PANELS, PAIR_PANELS_F32, ONEDNN, QUANTIZED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._forward(x)
        return y if self.lora is None else self.lora(x, y)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == QUANTIZED:
            return self.quant(x, self.bias)
        if self.layout == PANELS:
            return cpu_gemm.linear(x, self.weight, self.bias, self.out_features)
        if self.layout == PAIR_PANELS:
            return cpu_gemm_bf16.linear(x, self.weight, self.bias, self.out_features)
        if self.layout == PAIR_PANELS_F32:
            return cpu_gemm_bf16.linear_float32(x, self.weight, self.bias, self.out_features)
        if self.layout == ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.layout == TRANSPOSED:
            return x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)
        return dense_linear(x, self.weight, self.bias)

    def pack(
        self, compute_dtype: torch.dtype | None = None, quantization: str | None = None
    ) -> bool:
        """Readies a loaded CPU weight for a model computing in compute_dtype (default: the
        weight's; see the class docstring); returns whether it is packed for a matmul kernel.
        The dense copy is freed. A GPU's weight stays as loaded (quantized shards dequantized).
        quantization (EngineConfig's): "int8" or "int4" quantizes a float weight on the CPU;
        "none" dequantizes quantized shards; None keeps each weight's own format."""
        if self.layout != DENSE:
            return self.packed
        weight = self.weight
        compute_dtype = compute_dtype or weight.dtype
        on_cpu = weight.device.type == "cpu"
        if self.quantized_shards:
            shards = [self.quantized_shards[start] for start in sorted(self.quantized_shards)]
            whole = sum(s.shape[0] for s in shards) == self.out_features
            # By default a bfloat16 model keeps only what runs on bfloat16 tiles (the dense bits)
            keep = quantization != "none" and (
                quantization is not None
                or compute_dtype != torch.bfloat16
                or bf16_tiles_take(shards)
            )
            if whole and on_cpu and keep and kernel_takes(shards, compute_dtype):
                return self._pack_quantized(shards, compute_dtype)
            for start, shard in self.quantized_shards.items():
                dequantize_into(weight.data[start : start + shard.shape[0]], [shard])
            self.quantized_shards = {}
        elif quantization in ONLINE_QUANTIZERS and on_cpu and kernel_takes([], compute_dtype):
            quantized = quantize_online(weight, quantization)
            if quantized is not None:
                return self._pack_quantized([quantized], compute_dtype)
        if not on_cpu:
            return self.packed
        bfloat16_values = compute_dtype == torch.float32 and (
            weight.dtype == torch.bfloat16 or cpu_gemm.bfloat16_valued(weight)
        )  # one pass over the weight, for either kernel below
        if bfloat16_values and cpu_gemm_bf16.float32_amx(weight.shape[1]):
            weight, self.layout = cpu_gemm_bf16.pack(weight.bfloat16()), PAIR_PANELS_F32
        elif (
            compute_dtype == torch.float32
            and weight.dtype in cpu_gemm.WEIGHT_DTYPES
            and cpu_gemm.enabled()
        ):  # a bfloat16 weight keeps its dtype, a float32 one of bfloat16 values takes it
            if bfloat16_values:
                weight = weight.bfloat16()
            weight, self.layout = cpu_gemm.pack(weight), PANELS
        elif compute_dtype == weight.dtype == torch.bfloat16 and cpu_gemm_bf16.enabled():
            weight, self.layout = cpu_gemm_bf16.pack(weight), PAIR_PANELS
        else:
            weight = weight.to(compute_dtype)
            if weight.dtype in onednn_matmul_dtypes():
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_SIZE)
                self.layout = ONEDNN
            else:
                weight, self.layout = weight.t().contiguous(), TRANSPOSED
        self.weight = nn.Parameter(weight, requires_grad=False)
        return self.packed

    def _pack_quantized(self, shards: list[QuantizedWeight], dtype: torch.dtype) -> bool:
        self.quant = QuantizedPanels(shards, dtype)
        self.quantized_shards = {}
        empty = torch.empty(0, self.in_features, dtype=self.weight.dtype)
        self.weight = nn.Parameter(empty, requires_grad=False)  # the point: no dense copy
        self.layout = QUANTIZED
        return True

    def load_shard(
        self, name: str, tensor: torch.Tensor | QuantizedWeight, shard: int | None = 0
    ) -> None:
        """Copies a checkpoint tensor (nn.Linear layout: weight [out, in], bias [out]) into
        output shard `shard`, or, with None, all of them (a checkpoint that fuses them too). A
        QuantizedWeight is kept as it is until pack()."""
        assert self.layout == DENSE, "weights are loaded before pack()"
        whole = shard is None or len(self.output_sizes) == 1
        start = 0 if shard is None else sum(self.output_sizes[:shard])
        size = self.out_features if shard is None else self.output_sizes[shard]
        if isinstance(tensor, QuantizedWeight):
            assert name == "weight" and tensor.shape == (size, self.in_features), tensor.shape
            self.quantized_shards[start] = tensor
        elif name == "weight":
            assert tensor.shape == (size, self.weight.shape[1]), (tensor.shape, size)
            if whole:
                load_param(self.weight, tensor)
            else:
                self.weight.data[start : start + size].copy_(tensor)
        else:
            assert self.bias is not None and tensor.shape == (size,), tensor.shape
            self.bias.data[start : start + size].copy_(tensor)


class ClippedLinear(Linear):
    """A Linear whose outputs are clamped to [-clip, clip] (OLMo's and MPT's clip_qkv)."""

    def __init__(
        self, in_features: int, output_sizes: list[int] | int, bias: bool, clip: float
    ) -> None:
        super().__init__(in_features, output_sizes, bias=bias)
        self.clip = clip

    @classmethod
    def of(cls, linear: Linear, clip: float) -> "ClippedLinear":
        """A ClippedLinear shaped as linear (not yet loaded) would be: OLMo's and MPT's q/k/v."""
        return cls(linear.in_features, linear.output_sizes, linear.bias is not None, clip)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).clamp_(-self.clip, self.clip)


def load_param(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """Sets a whole parameter from a checkpoint tensor: adopts the tensor itself when it already
    has the parameter's dtype, device and layout (a safetensors tensor is a private mapping of
    the file, so this skips a copy of the weights at start-up), else copies it in."""
    assert param.shape == tensor.shape, (param.shape, tensor.shape)
    same = tensor.dtype == param.dtype and tensor.device == param.device
    if same and tensor.is_contiguous():
        param.data = tensor
    else:
        param.data.copy_(tensor)


def pack_linear_weights(
    model: nn.Module, compute_dtype: torch.dtype | None = None, quantization: str | None = None
) -> int:
    """Packs every Linear of a loaded model (see Linear.pack); returns how many were packed."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    return sum(m.pack(compute_dtype, quantization) for m in linears)


def describe_cpu_compute(dtype: torch.dtype) -> str:
    """One phrase for the startup line: how a model of dtype computes on this CPU."""
    compute = cpu_compute_dtype(dtype)
    matmuls = "oneDNN" if compute in onednn_matmul_dtypes() else "torch"
    if compute == torch.float32 and cpu_gemm.enabled():
        matmuls = "AVX-512 panel" if has_avx512() else "AVX2 panel"
    if compute == torch.bfloat16 and cpu_gemm_bf16.enabled():
        matmuls = "AMX panel" if cpu_gemm_bf16.amx_error() is None else "AVX512_BF16 panel"
    name = str(compute).removeprefix("torch.")
    if compute == dtype:
        return f"{matmuls} {name} matmuls"
    return (
        f"{matmuls} {name} matmuls and activations (no native {str(dtype).removeprefix('torch.')}"
        f" matmul on this CPU), {str(dtype).removeprefix('torch.')} KV cache"
    )


def describe_weights(model: nn.Module) -> str:
    """One phrase for the startup line: the weights' formats and their size as held (packed
    integers at their size), e.g. "weights int4 g128 +mins (AVX-512 VNNI) and float32, 0.81 GiB"."""
    params = {id(p): p for p in model.parameters()}.values()
    nbytes = sum(p.numel() * p.element_size() for p in params)
    formats = {
        f
        for m in model.modules()
        if isinstance(m, Linear) and m.quant is not None
        for f in m.quant.formats
    }
    floats = {str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point()}
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if any(m.weight.dtype == torch.int16 for m in linears):  # panels of bfloat16 bits
        on_amx = any(m.layout == PAIR_PANELS_F32 for m in linears)
        floats.add("bfloat16 (float32 matmuls on AMX)" if on_amx else "bfloat16")
    names = sorted(floats)
    suffix = bf16_suffix()
    on_bf16 = {f for f in formats if f.endswith(suffix)}
    integers = sorted(formats.difference(on_bf16))
    if integers:
        names = [f"{', '.join(integers)} ({cpu_gemm_quant.path_name()})", *names]
    if on_bf16:
        bf16 = sorted(f.removesuffix(suffix) for f in on_bf16)
        names = [f"{', '.join(bf16)} ({suffix.strip()})", *names]
    return f"weights {' and '.join(names)}, {nbytes / 2**30:.3g} GiB"
