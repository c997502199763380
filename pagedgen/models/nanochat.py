from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from pagedgen.models.names import renamed


class L2Norm(RMSNorm):
    """RMSNorm with no learned weight (a fixed one of ones, so its fused kernels apply)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__(hidden_size, eps)
        del self.weight
        self.register_buffer("weight", torch.ones(hidden_size), persistent=False)


class NanoChatAttention(LlamaAttention):
    """Llama attention with a weightless RMSNorm over each head of q and k. The reference norms
    after the rotary embedding, which keeps each head's RMS, so norming before it is the same."""

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
        self.q_norm = L2Norm(self.head_dim, config.rms_norm_eps)
        self.k_norm = L2Norm(self.head_dim, config.rms_norm_eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class NanoChatDecoderLayer(LlamaDecoderLayer):
    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return L2Norm(config.hidden_size, config.rms_norm_eps)


class NanoChatForCausalLM(LlamaForCausalLM):
    """Karpathy's nanochat (karpathy/nanochat-d32): the Llama decoder with weightless RMSNorms
    (the final one also norms the embeddings), weightless per-head q/k norms, rotary embeddings
    turning the other way (rotate_half's signs flipped: sin negated), an ungated MLP (fc1, relu2,
    fc2) and soft-capped logits (final_logit_softcapping)."""

    attention_cls = NanoChatAttention
    decoder_layer_cls = NanoChatDecoderLayer

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.embed_tokens(input_ids))

    def layer_ropes(self, positions: torch.Tensor) -> list[Rope]:
        rope = self.rotary(positions)
        return [Rope(rope.cos, -rope.sin)] * len(self.layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if (cap := self.config.final_logit_softcapping) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        rules = [(r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")]
        super().load_weights(renamed(weights, rules))
