import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.kernels import cpu_ops, layer_ops


class RMSNorm(nn.Module):
    """Computes in float32 and scales in the input dtype, exactly as Llama's reference does.

    Given the residual stream, adds x to it first (vLLM's fused_add_rms_norm) and returns both
    (normed, new residual): in one pass of our C op for float32 on the CPU, of our CUDA kernel
    on an NVIDIA GPU."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if (
            layer_ops.usable(x)
            and x.dim() == 2
            and x.stride(1) == 1
            and self.weight.dtype == x.dtype
        ):
            if residual is None:
                return layer_ops.rms_norm(x, self.weight, self.eps)
            if x.is_contiguous() and residual.is_contiguous():
                return layer_ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        fused = (
            cpu_ops.usable(x) and x.dim() == 2 and x.stride(1) == 1 and self.weight.dtype == x.dtype
        )
        if residual is None:
            return cpu_ops.rms_norm(x, self.weight, self.eps) if fused else self._norm(x)
        if fused and x.is_contiguous() and residual.is_contiguous():
            cpu_ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
            return x, residual
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * normed.to(x.dtype)
