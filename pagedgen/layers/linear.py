import torch
from torch import nn

from pagedgen.cpu_features import onednn_matmul_dtypes

# oneDNN's blocked weight layout is chosen for this many rows; any number of rows works.
PACK_BATCH_SIZE = 64


class Linear(nn.Module):
    """y = x @ weight (+ bias) with the weight laid out for the fastest kernel at hand.

    As loaded, the weight is dense and pre-transposed, [in_features, out_features]: below ~64 rows
    x @ W is several times faster than x @ W.T in nn.Linear's layout. On the CPU, pack() then moves
    it into oneDNN's blocked layout ([out_features, in_features], opaque), whose kernels run 2-3x
    faster than MKL's on these machines, with row results that do not depend on the batch. (Where
    oneDNN has no kernel for a half-precision dtype, the engine computes in float32 instead: see
    cpu_features.cpu_compute_dtype.)
    output_sizes splits the output columns into shards so that fused projections (QKV, gate/up)
    can load each checkpoint tensor into its own column range.
    """

    def __init__(self, in_features: int, output_sizes: list[int] | int, bias: bool = False) -> None:
        super().__init__()
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        out_features = sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    @property
    def packed(self) -> bool:
        return self.weight.is_mkldnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.bias is None:
            return x @ self.weight
        return torch.addmm(self.bias, x, self.weight)

    def pack(self) -> bool:
        """Moves the weight into oneDNN's layout where oneDNN has a kernel for its dtype on this
        CPU (see cpu_features.onednn_matmul_dtypes); returns whether it did. The dense copy is
        freed."""
        weight = self.weight
        if self.packed or weight.device.type != "cpu" or weight.dtype not in onednn_matmul_dtypes():
            return self.packed
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.t(), PACK_BATCH_SIZE)
        self.weight = nn.Parameter(packed, requires_grad=False)
        return True

    def load_shard(self, name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copies a checkpoint tensor (nn.Linear layout: weight [out, in], bias [out])."""
        assert not self.packed, "weights are loaded before pack()"
        start = sum(self.output_sizes[:shard])
        size = self.output_sizes[shard]
        if name == "weight":
            assert tensor.shape == (size, self.weight.shape[0]), (tensor.shape, size)
            self.weight.data[:, start : start + size].copy_(tensor.t())
        else:
            assert self.bias is not None and tensor.shape == (size,), tensor.shape
            self.bias.data[start : start + size].copy_(tensor)


def pack_linear_weights(model: nn.Module) -> int:
    """Packs every Linear of a loaded model (see Linear.pack); returns how many were packed."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
