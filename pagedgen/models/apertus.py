"""Apertus (Swiss AI's Apertus-8B and 70B, base and instruct)."""

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.activation import get_act_fn
from pagedgen.layers.linear import Linear
from pagedgen.models.names import renamed
from pagedgen.models.qwen3 import Qwen3ForCausalLM

APERTUS_RENAMES = (
    (r"\.attention_layernorm\.", ".input_layernorm."),
    (r"\.feedforward_layernorm\.", ".post_attention_layernorm."),
)
XIELU_BUFFERS = ("beta", "eps")  # saved with the checkpoint, but no parameters


class XIELU(nn.Module):
    """xIELU (arXiv 2411.13010), as transformers' XIELUActivation computes it in Python:
    alpha_p * x^2 + beta * x for x > 0, else (expm1(min(x, eps)) - x) * alpha_n + beta * x,
    with alpha_p = softplus(alpha_p') and alpha_n = beta + softplus(alpha_n') from the learned
    scalars alpha_p', alpha_n' of each layer; beta and eps are the checkpoint's too."""

    def __init__(self, beta: float = 0.5, eps: float = -1e-6) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.empty(1), requires_grad=False)
        self.alpha_n = nn.Parameter(torch.empty(1), requires_grad=False)
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(
            x > 0,
            alpha_p * x * x + self.beta * x,
            (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x,
        )


class ApertusMLP(nn.Module):
    """The ungated, unbiased MLP down(act(up(x))), act xIELU (hidden_act "xielu") or another."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        act = config.hidden_act
        self.act_fn = XIELU() if act == "xielu" else get_act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


class ApertusForCausalLM(Qwen3ForCausalLM):
    """Apertus: Qwen3's decoder (RMSNorms, an RMSNorm over each head of q and k before the
    rotary embedding, llama3-scaled by default; q/k/v and o biased where attention_bias) with
    an ungated unbiased MLP (up_proj, down_proj) whose xIELU activation has learned scalars per
    layer (mlp.act_fn.alpha_p, alpha_n, and its beta and eps); the layer norms are named
    attention_layernorm and feedforward_layernorm, renamed to Llama's as they load."""

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return ApertusMLP(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._set_xielu_buffers(renamed(weights, APERTUS_RENAMES)))

    def _set_xielu_buffers(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors, less xIELU's beta and eps, copied into our buffers."""
        buffers = dict(self.named_buffers())
        for name, tensor in weights:
            module, _, leaf = name.removeprefix("model.").rpartition(".")
            if module.endswith(".act_fn") and leaf in XIELU_BUFFERS:
                buffers[f"{module}.{leaf}"].copy_(tensor.reshape(()))
            else:
                yield name, tensor
