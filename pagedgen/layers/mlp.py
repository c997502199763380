import torch
from torch import nn

from pagedgen.layers.activation import get_act_fn
from pagedgen.layers.linear import Linear


class MLP(nn.Module):
    """The ungated feed-forward block, down(act(up(x))) (GPT-2, GPT-NeoX, Phi, StarCoder2,
    Nemotron): up_proj and down_proj whatever the checkpoint calls them (each model renames its
    own as they load), so LoRA's down_proj target finds them."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool) -> None:
        super().__init__()
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = get_act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))
