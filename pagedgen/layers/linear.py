import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.cpu_features import onednn_matmul_dtypes

# oneDNN's blocked weight layout is chosen for this many rows; any number of rows works.
PACK_BATCH_SIZE = 64


class Linear(nn.Module):
    """y = x @ weight.T (+ bias), loaded in nn.Linear's layout [out_features, in_features], as
    checkpoints store it (loading copies rows, no transposes).

    On the CPU, pack() then readies the weight for the fastest kernel at hand: oneDNN's blocked
    layout (opaque), whose kernels run 2-3x faster than MKL's on these machines, with row results
    that do not depend on the batch; where oneDNN has no kernel for the dtype, a dense transposed
    copy [in_features, out_features], as x @ W is several times faster than x @ W.T below ~64
    rows. (A half-precision model whose dtype oneDNN lacks computes in float32 instead: see
    cpu_features.cpu_compute_dtype.)
    output_sizes splits the output rows into shards so that fused projections (QKV, gate/up)
    can load each checkpoint tensor into its own row range.
    """

    def __init__(self, in_features: int, output_sizes: list[int] | int, bias: bool = False) -> None:
        super().__init__()
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        out_features = sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.transposed = False  # weight is [in_features, out_features]

    @property
    def packed(self) -> bool:
        return self.weight.is_mkldnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.transposed:
            return x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)
        return F.linear(x, self.weight, self.bias)

    def pack(self) -> bool:
        """Readies a loaded CPU weight (see the class docstring); returns whether it is packed
        for oneDNN. The dense copy is freed. A GPU's weight stays as loaded."""
        weight = self.weight
        if self.packed or self.transposed or weight.device.type != "cpu":
            return self.packed
        if weight.dtype in onednn_matmul_dtypes():
            weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_SIZE)
        else:
            weight = weight.t().contiguous()
            self.transposed = True
        self.weight = nn.Parameter(weight, requires_grad=False)
        return self.packed

    def load_shard(self, name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copies a checkpoint tensor (nn.Linear layout: weight [out, in], bias [out])."""
        assert not (self.packed or self.transposed), "weights are loaded before pack()"
        start = sum(self.output_sizes[:shard])
        size = self.output_sizes[shard]
        if name == "weight":
            assert tensor.shape == (size, self.weight.shape[1]), (tensor.shape, size)
            if len(self.output_sizes) == 1:
                load_param(self.weight, tensor)
            else:
                self.weight.data[start : start + size].copy_(tensor)
        else:
            assert self.bias is not None and tensor.shape == (size,), tensor.shape
            self.bias.data[start : start + size].copy_(tensor)


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


def pack_linear_weights(model: nn.Module) -> int:
    """Packs every Linear of a loaded model (see Linear.pack); returns how many were packed."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
