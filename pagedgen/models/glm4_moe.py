from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.norm import RMSNorm
from pagedgen.models.deepseek import deepseek_mlp, deepseek_names
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM


class Glm4MoeAttention(LlamaAttention):
    """Llama attention (q/k/v biased where attention_bias, o never) whose q and k are normed
    per head before RoPE where use_qk_norm, as Qwen3's are."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.has_qk_norm = bool(config.use_qk_norm)
        if self.has_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.q_norm(q), self.k_norm(k)) if self.has_qk_norm else (q, k)


class Glm4MoeForCausalLM(LlamaForCausalLM):
    """GLM-4.5 / 4.6 (and GLM-4.5-Air): grouped-query attention rotating half of each head
    (partial_rotary_factor 0.5), DeepSeek-V3's MoE (sigmoid routing with the correction bias,
    shared experts, the first first_k_dense_replace layers dense); the multi-token-prediction
    layer past num_hidden_layers is skipped, as transformers skips it."""

    attention_cls = Glm4MoeAttention
    supports_graphs = False  # the expert routing reads token counts on the host

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return deepseek_mlp(config, index)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(deepseek_names(weights, len(self.layers)))
