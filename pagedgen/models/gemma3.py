import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.rotary import layer_type_ropes
from pagedgen.models.gemma2 import Gemma2Attention, Gemma2ForCausalLM, GemmaRMSNorm
from pagedgen.models.llama import LayerOptions


class Gemma3Attention(Gemma2Attention):
    """Gemma 2's attention plus a (1 + weight) RMSNorm over each head of q and k, before rope."""

    has_qk_norm = True

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text: Gemma 2 with q/k norms, no soft caps by default, five local layers per global
    one, and a rope base per kind of layer (10k local, 1M global)."""

    attention_cls = Gemma3Attention

    @staticmethod
    def build_ropes(config: PretrainedConfig, head_dim: int, max_position: int) -> nn.ModuleDict:
        return layer_type_ropes(config, head_dim, max_position)
