import torch
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.norm import RMSNorm
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """Llama attention plus an RMSNorm over each head of q and k, before the rotary embedding."""

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
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen3Attention
