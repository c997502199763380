import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.rotary import Rope
from pagedgen.models.gemma2 import Gemma2ForCausalLM


class VaultGemmaDecoderLayer(nn.Module):
    """Gemma 2's layer without its two post-sublayer norms: a norm before the attention and one
    before the MLP, each output added to the stream as it is."""

    def __init__(
        self,
        attention: nn.Module,
        mlp: nn.Module,
        input_layernorm: nn.Module,
        pre_feedforward_layernorm: nn.Module,
    ) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.pre_feedforward_layernorm = pre_feedforward_layernorm

    def forward(
        self, rope: Rope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(rope, self.input_layernorm(hidden), metadata)
        return hidden + self.mlp(self.pre_feedforward_layernorm(hidden))


class VaultGemmaForCausalLM(Gemma2ForCausalLM):
    """VaultGemma (google/vaultgemma-1b, trained with differential privacy): Gemma 2 (scaled
    embeddings, GeGLU, soft caps, local and global layers) with pre-norms only."""

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        self.layers = nn.ModuleList(  # Gemma 2's modules, their sliding windows set
            VaultGemmaDecoderLayer(
                layer.self_attn, layer.mlp, layer.input_layernorm, layer.pre_feedforward_layernorm
            )
            for layer in self.layers
        )
