import torch
import torch.nn.functional as F
from torch import nn

from pagedgen.kernels import cpu_ops, layer_ops


class SiluAndMul(nn.Module):
    """silu(gate) * up for rows [gate | up]: [num_tokens, 2 * d] -> [num_tokens, d]; one pass of
    our C op for float32 on the CPU, of our CUDA kernel on an NVIDIA GPU."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if layer_ops.usable(gate_up) and gate_up.dim() == 2 and gate_up.is_contiguous():
            return layer_ops.silu_and_mul(gate_up)
        if cpu_ops.usable(gate_up) and gate_up.dim() == 2 and gate_up.is_contiguous():
            return cpu_ops.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


# The tanh approximation of GELU under its names: gelu_new and gelu_fast are transformers'
# Python formulas of it (several ops), computed here by torch's one op (equal up to rounding).
TANH_GELU = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_tanh")


def get_act_fn(name: str) -> nn.Module:
    """The activation a config names (hidden_act: gelu, gelu_new, gelu_pytorch_tanh, relu2, ...):
    one torch op where there is one, else transformers' own module for it."""
    from transformers.activations import ACT2FN

    if name in TANH_GELU:
        return nn.GELU(approximate="tanh")
    if name not in ACT2FN:
        raise ValueError(f"hidden_act {name!r} is not supported")
    return ACT2FN[name]
