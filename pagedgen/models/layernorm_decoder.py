"""The decoder layers of the models before Llama's (GPT-2, GPT-NeoX, Phi, Falcon, ...): LayerNorm
for RMSNorm, and the parallel block, attention and MLP reading the same input."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionMetadata
from pagedgen.layers.norm import LayerNorm, add_norm
from pagedgen.layers.rotary import Rope
from pagedgen.models.llama import LlamaDecoderLayer


def norm_eps(config: PretrainedConfig) -> float:
    """The LayerNorm epsilon, under whichever name the config gives it."""
    for name in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps"):
        if (eps := getattr(config, name, None)) is not None:
            return eps
    return 1e-5


class LayerNormDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (norm, attention, add, norm, MLP, add) with LayerNorms, biased unless
    norm_bias is False; the model's final norm is one too."""

    norm_bias = True

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return LayerNorm(config.hidden_size, norm_eps(config), bias=cls.norm_bias)


class ParallelDecoderLayer(nn.Module):
    """Attention and MLP side by side, their outputs added to the stream together:
    x + attn(norm(x)) + mlp(norm(x)) (GPT-J, Phi, Cohere, Falcon-7B), or, given mlp_norm, the
    MLP reading x through a norm of its own (GPT-NeoX, Falcon-40B). Takes and returns
    (hidden, residual) as the Llama layers do."""

    def __init__(
        self,
        attention: nn.Module,
        mlp: nn.Module,
        input_layernorm: nn.Module,
        mlp_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = mlp_norm  # GPT-NeoX's name for it

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = add_norm(self.input_layernorm, hidden, residual)
        mlp_norm = self.post_attention_layernorm
        mlp_input = normed if mlp_norm is None else mlp_norm(residual)
        return self.self_attn(rope, normed, metadata) + self.mlp(mlp_input), residual
