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


def add_norm(
    norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's input norm over the stream hidden + residual, and that stream; the first
    layer's hidden is the stream itself (residual None)."""
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)


class ResidualNorm(nn.Module):
    """A norm with RMSNorm's interface, its own _norm() the computation: given the residual
    stream, adds x to it first and returns (normed, new residual)."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LayerNorm(ResidualNorm):
    """LayerNorm (GPT-2, GPT-NeoX, Phi, Cohere, ...) with RMSNorm's interface.

    shape (num_heads, head_dim) normalizes each head over head_dim with a weight per head
    (Cohere's and StableLM's q/k norms). Computes as torch.nn.LayerNorm in the input dtype, or,
    with upcast, in float32 and rounds once (Cohere's own LayerNorm)."""

    def __init__(
        self, shape: int | tuple[int, ...], eps: float, bias: bool = True, upcast: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(shape), requires_grad=False) if bias else None
        self.eps, self.upcast = eps, upcast

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.weight.shape[-1:]
        weight, bias = self.weight, self.bias
        if self.upcast:
            normed = F.layer_norm(x.float(), dim, None, None, self.eps) * weight.float()
            return (normed if bias is None else normed + bias.float()).to(x.dtype)
        if weight.dim() == 1:
            return F.layer_norm(x, dim, weight, bias, self.eps)
        normed = F.layer_norm(x, dim, None, None, self.eps) * weight
        return normed if bias is None else normed + bias
